"""docs/quickstart.ipynb, run for real: a Jupyter kernel of this very python executes it through nbclient, and
its outputs, put in a page the ways front ends do (conftest.py), are opened in Debian's chromium. The tables
render with the results' own numbers, both inline viewers draw, and hovering a token highlights the key that
the notebook itself printed as that token's strongest, with the weight it printed.

The kernel is described by a kernel spec written into a temporary Jupyter path (JUPYTER_PATH) whose command
is ``sys.executable -m ipykernel_launcher``: no kernel needs installing, and a fresh clone's ``make test``
(.venv with ``.[all]``) runs it as it is.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "quickstart.ipynb"
KERNEL = "headlab-tests"
STRONGEST = re.compile(r"^\s*(\d+)\s+(\S+) attends most to\s+(\d+) '(.*)'\s+([\d.]+)$")


def test_the_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The notebook after a kernel ran every cell (in a temporary folder: it writes nothing here)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "path" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "headlab tests", "language": "python",
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},  # the debugger's note on frozen modules, on stderr
    }))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", str(root / "path"))
        env.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
        env.setenv("JUPYTER_PLATFORM_DIRS", "1")
        env.setenv("IPYTHONDIR", str(root / "ipython"))
        client = nbclient.NotebookClient(notebook, kernel_name=KERNEL, timeout=600,
                                         resources={"metadata": {"path": str(root)}})
        client.execute()
    return notebook


def _outputs(notebook: Any) -> list[dict[str, Any]]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def _as_html(output: dict[str, Any]) -> str:
    """An output as a front end draws it: its HTML when it has some, else its text, escaped."""
    data = output.get("data", {})
    if "text/html" in data:
        return data["text/html"]
    return f"<pre>{html.escape(data.get('text/plain', output.get('text', '')))}</pre>"


def test_every_cell_runs_and_shows_text_briefly(executed: Any) -> None:
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    outputs = _outputs(executed)
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    # a deprecated call in the notebook, say (tqdm's note that ipywidgets is not installed is not ours)
    assert not re.search(r"headlab\S*\.py:\d+: \w*Warning|(Deprecation|Future)Warning", stderr), stderr
    results = [o for o in outputs if o.output_type == "execute_result"]
    assert all("text/html" in o.data for o in results)
    titles = [o.data["text/plain"].splitlines()[0] for o in results]
    assert titles[0] == "HeadedModel: BertModel, 6 layers × 12 heads" and "interventions: none" in results[0].data[
        "text/plain"] and len(results[0].data["text/plain"].splitlines()) <= 6
    assert titles[1].startswith("Cache of one") and len(results[1].data["text/plain"].splitlines()) <= 6
    assert titles[2] == "PatchingResult: attribution patching of 72 heads"
    assert titles[3] == "HeadTable(12 heads, columns ['effect', 'change'])"
    assert [t.split(":")[0] for t in titles[4:]] == ["InlineViewer", "InlineViewer"]


def _strongest(executed: Any) -> dict[int, tuple[int, float]]:
    """What the notebook printed of layer 2, head 3: per query position, its strongest key and that weight."""
    printed = "".join(o.get("text", "") for o in _outputs(executed) if o.get("name") == "stdout")
    found = {int(m[1]): (int(m[3]), float(m[5])) for m in (STRONGEST.match(line) for line in printed.splitlines()) if m}
    assert len(found) == 9, printed  # [CLS] the cat sat on the mat . [SEP]
    return found


def test_the_outputs_render_and_the_viewers_answer_a_hover(executed: Any, tab: Any, tmp_path: Path, mode: str) -> None:
    strongest = _strongest(executed)
    tab.open([_as_html(o) for o in _outputs(executed)], mode, tmp_path / "quickstart.html")
    page = tab.page
    # the tables: the cache's, and the attribution patching grid with its own numbers and shading
    cache = page.locator(".headlab-repr", has_text="Cache of one").first
    assert "(batch, head, query_pos, key_pos)" in cache.inner_text()
    grid = page.locator(".headlab-repr", has_text="PatchingResult: attribution patching").first
    cells = grid.locator("td[title^='L']").evaluate_all(
        "tds => tds.map(t => [t.title, getComputedStyle(t).backgroundColor, t.textContent])")
    assert len(cells) == 72
    values = {title.split(":")[0]: float(title.split(": ")[1]) for title, _, _ in cells}
    largest = max(values, key=lambda h: abs(values[h]))
    assert re.search(rf"largest \|effect\|\s*{largest}\b", grid.inner_text())  # the facts name the grid's largest
    alpha = {title.split(":")[0]: float(colour.rsplit(",", 1)[1].rstrip(")")) if colour.startswith("rgba") else 1.0
             for title, colour, _ in cells}
    assert alpha[largest] == 1.0 and all(a < 1.0 for h, a in alpha.items() if abs(values[h]) < abs(values[largest]))

    # the two inline viewers (a model run on two texts, a cache): drawn, and answering a hover
    page.wait_for_function("document.querySelectorAll('.hv[data-ready=\"1\"]').length === 2", timeout=30_000)
    for i in range(2):
        root = page.locator(".hv").nth(i)
        sizes = root.locator(".hv-thumb canvas").evaluate_all("cs => cs.map(c => c.width * c.height)")
        assert len(sizes) == 72 and min(sizes) > 0
        root.locator(".hv-thumb[data-layer='2'][data-head='3']").click()
        page.wait_for_function("r => r.dataset.ready === '1' && r.dataset.layer === '2' && r.dataset.head === '3'",
                               arg=root.element_handle())
        assert root.locator(".hv-matrix").evaluate("c => c.width") > 0
        for pos in (2, 6):
            to, _ = tab.hover(root, pos)
            key, weight = strongest[pos]
            assert len(to) == 9 and max(range(9), key=to.__getitem__) == key
            assert abs(to[key] - weight) <= weight / 510 + 5e-4  # the encoding's step and the printed rounding
        other = page.locator(".hv").nth(1 - i)
        assert other.get_attribute("data-focus") in (None, str(6)) and root.get_attribute("data-focus") == "6"
    tab.shot(f"notebook-quickstart-{mode}")
    tab.assert_clean()
