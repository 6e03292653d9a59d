"""The README's python examples run, and the values their comments promise are what they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.support.regenerate import README as README_REGION
from tests.support.regenerate import readme_sentences

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# `print(...)  # (2, 10, 64): prose` or `print(...)  # 8: prose` -> the promised value.
_PROMISE = re.compile(r"^print\(.*\)\s*#\s*(\([\d, ]*\)|-?\d+)")


def _blocks() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def _normalise(printed: str) -> str:
    """`torch.Size([2, 10, 64])` -> `(2, 10, 64)`; `tensor(8)` -> `8`."""
    printed = re.sub(r"^torch\.Size\(\[(.*)\]\)$", r"(\1)", printed.strip())
    return re.sub(r"^tensor\((-?\d+)\)$", r"\1", printed)


def test_readme_has_python_examples() -> None:
    assert _blocks(), f"no ```python blocks found in {README}"


def test_readme_python_examples_run_and_print_what_they_promise() -> None:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for line, source in _blocks():
        # Pad with newlines so tracebacks point at the README line.
        compiled = compile("\n" * (line - 1) + source, str(README), "exec")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exec(compiled, namespace)  # noqa: S102 - executing our own documentation

        # A block whose every top-level print carries a promised value is checked line by line.
        prints = [s for s in source.splitlines() if s.startswith("print(")]
        promised = [m.group(1) for s in prints if (m := _PROMISE.match(s))]
        if prints and len(promised) == len(prints):
            printed = [_normalise(p) for p in stdout.getvalue().splitlines()]
            assert printed == promised, f"README block at line {line}: printed {printed}, comments say {promised}"


def test_readme_sentences_about_minilm_are_what_the_analysis_says() -> None:
    """The README's sentences about MiniLM's heads are written by the analysis, never typed: `make readme`
    rewrites the block (tests/support/regenerate.py) and this test checks it still says what a run says."""
    README_REGION.check(readme_sentences())
