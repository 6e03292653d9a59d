"""The bad-input battery: every command against the bad input a new user tries.

Each case runs the command in an empty working folder and asserts: exit status 2 (1 for Ctrl-C
or for a module that audit found failing), exactly one line of output naming the bad value and
what was expected, no traceback, and nothing written: the working folder and the inputs as they
were, no output half-written, no temporary folder left behind. ``@`` in a command stands for the
folder of prepared inputs; every case fails before any long work, so the battery is fast.
"""

from __future__ import annotations

import dataclasses
import importlib
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.capture.corpus import MAX_ITEM_CHARS
from headlab.cli import app

transformers = pytest.importorskip("transformers")

runner = CliRunner()
HUB_ID = "no-such-org/no-such-model"
NOT_CACHED = f"'{HUB_ID}' is not a local directory, and its config is not in the local Hugging Face Hub cache"
OUTSIDE = "outside transformers' AttentionInterface"  # the reason BLOOM (inline ALiBi) is refused
BEYOND = "/proc/headlab-battery/out" if sys.platform == "linux" else None  # /proc takes no new folder, even from root


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every kind of input the cases use, good and bad."""
    from tests.support.tiny import save_causal_checkpoint

    root = tmp_path_factory.mktemp("inputs")
    (root / "afile").write_text("a file, not a folder\n")
    (root / "adir").mkdir()
    (root / "adir" / "notes.txt").write_text("someone's notes, never to be deleted\n")
    (root / "pkg.py").mkdir()
    (root / "empty.txt").write_text("\n  \n")
    (root / "binary.bin").write_bytes(b"\xd5\x00\xff\x10binary")
    (root / "huge.txt").write_text("x" * (MAX_ITEM_CHARS + 1) + "\n")
    (root / "corpus.txt").write_text("the cat sat on the mat\na big red dog ran\n")
    (root / "exit3.py").write_text("import sys\nsys.exit(3)\n")
    (root / "config_layer.py").write_text(  # a constructor that takes a config object; no parameter is 32 wide
        "import torch\nclass L(torch.nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.randn(config.heads, 8, 8))\n"
        "    def forward(self, x):\n        assert x.shape[-1] == 32, 'needs 32 wide'\n"
        "        return torch.softmax(x @ x.transpose(-1, -2), -1) @ x\n")
    (root / "foreign.json").write_text('{"not": "bench results"}\n')
    config = transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=4,
                                      architectures=["BloomForCausalLM"])
    config.save_pretrained(root / "bloom")
    (root / "bloom" / "model.safetensors").write_bytes(b"never read")
    save_causal_checkpoint(root / "tiny")  # 2 layers x 4 heads
    return root


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and time; Python's bytecode cache of an audited file aside."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if "__pycache__" not in p.parts}


def _invoke(command: str, inputs: Path) -> tuple[object, str]:
    result = runner.invoke(app, shlex.split(command.replace("@", str(inputs))))
    return result, result.output.strip()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a hub id reads the cache only
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _case(command: str, fragment: str, code: int = 2, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(command, fragment, code, id=command, marks=marks)


CORPUS = "--quick --no-importance --no-syntax --text @/corpus.txt"
PATCH = "--clean 'the cat sat on the' --corrupt 'the dog sat on the' --answer mat --wrong cat"
CASES = [
    # missing paths, and paths of the wrong kind
    *(_case(f"{cmd} --text @/missing.txt", "missing.txt' does not exist; expected a UTF-8 text file")
      for cmd in ("analyze", "report", "view")),
    *(_case(f"{cmd} --text @/adir", "adir' is a directory; expected a UTF-8 text file")
      for cmd in ("analyze", "report", "view")),
    *(_case(f"{cmd} @/nope {extra}", "nope: no such directory; expected a transformers checkpoint directory")
      for cmd, extra in (("analyze", ""), ("report", ""), ("view", "'the cat'"), ("patch", PATCH), ("bench", ""))),
    *(_case(f"{cmd} @/afile {extra}", "afile: is a file; expected a checkpoint directory")
      for cmd, extra in (("analyze", ""), ("view", "'the cat'"), ("patch", PATCH), ("bench", ""))),
    _case("audit @/missing.py:X", "missing.py is not a file"),
    _case("audit @/pkg.py:X", "pkg.py is not a file"),
    _case("audit @/afile:X", "afile:X' is not PATH.py:ClassName"),
    # corpus files: empty, binary, a line too long to be one item
    *(_case(f"{cmd} --text @/empty.txt", "empty.txt' has no item: 2 line(s), all blank")
      for cmd in ("analyze", "report")),
    _case("view --text @/empty.txt", "empty.txt' holds no text (empty or blank)"),
    *(_case(f"{cmd} --text @/binary.bin", "binary.bin' is not UTF-8 text: line 1, column 1 holds byte 0xd5; "
                                          "expected a UTF-8 text file") for cmd in ("analyze", "report", "view")),
    *(_case(f"{cmd} --text @/huge.txt", f"huge.txt', line 1: {MAX_ITEM_CHARS + 1:,} characters; expected at most")
      for cmd in ("analyze", "report")),
    # output locations: a file, below a file, a folder where a file goes, someone else's folder, beyond reach
    *(_case(f"{cmd} --out @/afile", "afile' is a file; expected a folder")
      for cmd in ("analyze", "report", f"patch {PATCH}", "experiment symmetry")),
    *(_case(f"{cmd} --out @/afile/x", "afile/x' lies below '@/afile', which is a file")
      for cmd in ("analyze", "report", f"patch {PATCH}", "experiment symmetry", "bench", "view 'the cat'")),
    *(_case(f"{cmd} --out @/adir", "adir' is a folder; expected a file path") for cmd in ("bench", "view 'the cat'")),
    *(_case(f"{cmd} --out @/adir", "adir' is a folder that holds other files and no")
      for cmd in ("analyze", "report")),
    _case("bench --out @/results.json", "results.json' is the JSON file; expected the Markdown file"),
    _case("bench --out @/foreign.md", "foreign.json: not a headlab bench results file"),
    *(_case(f"{cmd} --out {BEYOND}", f"cannot write {BEYOND}", 2,
            pytest.mark.skipif(BEYOND is None, reason="needs Linux's /proc"))
      for cmd in ("analyze", "report", f"patch {PATCH}", "experiment symmetry", "bench", "view 'the cat'")),
    # a hub id not in the local cache, offline
    *(_case(f"{cmd} {HUB_ID} {extra}", NOT_CACHED)
      for cmd, extra in (("analyze", ""), ("report", ""), ("view", "'the cat'"), ("patch", PATCH), ("bench", ""))),
    # an architecture headlab cannot serve
    *(_case(f"{cmd} @/bloom {extra}", OUTSIDE) for cmd, extra in (("analyze", ""), ("report", ""),
                                                                   ("view", "'the cat'"), ("patch", PATCH),
                                                                   ("bench", ""))),
    # view's arguments: which one is the model, which the text
    _case("view @/tiny", "no text given: '@/tiny' names a model"),
    _case(f"view {HUB_ID}", f"no text given: '{HUB_ID}' names a model"),
    _case("view hello --text @/corpus.txt", "'hello' is neither a directory nor an org/name hub id"),
    _case("view @/corpus.txt", "corpus.txt' is a file; to view the text in it, use --text"),
    _case("view @/tiny '  '", "the text is empty or blank"),
    # out-of-range layers and heads
    _case(f"analyze @/tiny {CORPUS} --layers 7", "layer 7"),
    _case(f"analyze @/tiny {CORPUS} --heads 4", "head 4"),
    _case(f"analyze @/tiny {CORPUS} --layers 99999999999999999999", "layer 99999999999999999999"),
    _case("view @/tiny 'the cat' --layers 2", "layer 2"),
    _case(f"patch @/tiny {PATCH} --heads 9", "head 9"),
    *(_case(f"{cmd} --layers -1", "'-1' is not a layer index ≥ 0 or a name")
      for cmd in ("analyze", "view 'the cat'", f"patch {PATCH}")),
    _case(f"analyze @/tiny {CORPUS} --layers encoder", "layers has 'encoder', which names no layer: expected a layer "
                                                      "0..1, an address such as 'blocks.0.attn', 'blocks.1.attn'"),
    # zero, negative and huge numbers
    *(_case(f"{cmd} --seed {seed}", f"--seed: {seed} is not an int in [0, 2**63)")
      for cmd in ("report", "experiment symmetry", "audit @/exit3.py:X") for seed in (-1, 2**63)),
    *(_case(f"{cmd} --port {port}", "--port") for cmd in ("report", "view 'the cat'") for port in (-1, 65536)),
    *(_case(f"experiment symmetry --steps {steps}", f"--steps: {steps} is not a positive int ≤ 100,000")
      for steps in (0, -4, 10**20)),
    *(_case(f"bench --threads {n}", "--threads") for n in (0, 10**6)),
    *(_case(f"patch {PATCH} --top {n}", "--top") for n in (0, -1)),
    *(_case(f"audit @/exit3.py:X --d-model {n}", "--d-model") for n in (0, 10**9)),
    *(_case(f"params {option}", option.split()[0]) for option in ("--d-model 0", "--seq 0", "--n-heads 0",
                                                                  "--n-heads 2,x", "--variants bogus")),
    _case("params --d-model 1000000000 --variants wide", "the layer's tensors are too large"),
    # names and choices
    _case("experiment nope", "unknown experiment 'nope'"),
    _case(f"patch {PATCH} --method fast", "'fast' is not one of exact, attribution, both"),
    _case("bench --device tpu", "device='tpu'"),
    # analyze's engine and its options
    _case("analyze --engine spark", "--engine: 'spark' is not one of local, ray"),
    *(_case(f"analyze --engine ray --workers {n}", f"'{n}' is not a positive int") for n in ("0", "-2", "two")),
    _case("analyze --engine ray --workers 2,3", "--workers: '2,3' is a list; expected one positive int"),
    *(_case(f"analyze {option}", f"{option.split()[0]}: '{option.split()[1]}' is for the Ray engine; expected "
                                 "--engine ray with it (got --engine local)")
      for option in ("--address auto", "--workers 2")),
    _case("analyze --engine ray --address nonsense", "address='nonsense' is not a Ray cluster address; expected "
                                                     "host:port"),
    _case("analyze --engine ray --address 127.0.0.1:1", "no Ray cluster answers at address='127.0.0.1:1'"),
    _case("audit @/exit3.py:X --call sideways", "'sideways' is not one of self, qkv, vkq"),
    _case("audit @/exit3.py:X --init '[1]'", "is JSON list; expected an object"),
    _case("audit @/exit3.py:X --factory nocolon", "--factory 'nocolon' is not module:function"),
    _case("audit @/config_layer.py:L", "L(config) needs config: give it in --init; an object such as"),
    _case("audit @/config_layer.py:L --init '{\"config\": {}}'", 'add "heads" to the "config" object'),
    _case("audit @/config_layer.py:L --factory config_layer:make", "config_layer defines no function 'make'"),
    # the module runs but not at any width its parameters suggest: the fix is named
    _case("audit @/config_layer.py:L --init '{\"config\": {\"heads\": 4}}'",
          "forward(x) raised AssertionError: needs 32 wide (d_model=8, 4); to fix: if its input width is none of "
          "8, 4, pass it (--d-model N)", 1),
    *(_case(f"{cmd} --bogus", "No such option: --bogus") for cmd in ("report", "analyze", "bench", "params")),
    _case("--bogus", "No such option: --bogus (see 'headlab --help')"),  # the group's own options
    _case("bogus", "No such command 'bogus' (see 'headlab --help')"),
    # the audited file exits while it is imported: the module failed (1), said in one line
    _case("audit @/exit3.py:X", "exit3.py called sys.exit(3) while being imported", 1),
]


@pytest.mark.parametrize(("command", "fragment", "code"), CASES)
def test_bad_input_is_one_line_and_writes_nothing(command: str, fragment: str, code: int, inputs: Path,
                                                  workdir: Path) -> None:
    before = _snapshot(inputs)
    result, said = _invoke(command, inputs)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "\n" not in said, result.output
    assert said.startswith("error: ") and fragment.replace("@", str(inputs)) in said, said
    assert _snapshot(inputs) == before and not any(workdir.iterdir())


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def _stop_report(monkeypatch: pytest.MonkeyPatch) -> None:
    import headlab.report.sections as registry
    from headlab.report import Section

    def render(ctx):
        ctx.write_file("assets/half.json", "{}")  # part of the new report is written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("stops", "Stops", render)])


def _stop_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.experiments import EXPERIMENTS

    monkeypatch.setitem(EXPERIMENTS, "symmetry", dataclasses.replace(EXPERIMENTS["symmetry"], run=_interrupt))


def _stop_at(module: str, name: str):
    """Replace ``module.name``, a step the command looks up when it runs, by a Ctrl-C."""
    def stop(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(importlib.import_module(module), name, _interrupt)
    return stop


def _bench_results() -> str:
    from headlab.bench.results import FORMAT

    return f'{{"format": "{FORMAT}", "runs": {{}}}}\n'


INTERRUPTED = [  # (command, what to stop, the old output it must leave, --out as the message names it)
    pytest.param("report --out rep", _stop_report, {"rep/report.json": "{}", "rep/index.html": "old"}, "rep",
                 id="report"),
    pytest.param(f"analyze @/tiny {CORPUS}", _stop_at("headlab.analysis.analyze", "analyze"),
                 {"analysis/heads.json": "old"}, "analysis", id="analyze"),
    pytest.param("view @/tiny 'the cat'", _stop_at("headlab.report.viewer", "view_data"), {"view.html": "old"},
                 "view.html", id="view"),
    pytest.param(f"patch @/tiny {PATCH} --method attribution", _stop_at("headlab.analysis.patching",
                                                                       "plot_patching"),
                 {"patching/patching.json": "old", "patching/patching.png": "old"}, "patching", id="patch"),
    pytest.param("experiment symmetry --out results", _stop_experiment, {"results/symmetry.json": "old"}, "results",
                 id="experiment"),
    pytest.param("bench --out RESULTS.md", _stop_at("headlab.bench", "run_suite"),
                 {"RESULTS.md": "old", "RESULTS.json": None}, "RESULTS.md", id="bench"),
    pytest.param("audit @/exit3.py:X", _stop_at("headlab.audit", "load_module"), {}, None, id="audit"),
]


@pytest.mark.parametrize(("command", "stop", "old", "out"), INTERRUPTED)
def test_ctrl_c_mid_run_exits_1_and_leaves_the_old_output_as_it_was(command: str, stop, old: dict[str, str | None],
                                                                   out: str | None, inputs: Path, workdir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in old.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(_bench_results() if text is None else text)
    before = {name: (workdir / name).read_text() for name in old}
    stop(monkeypatch)
    result, said = _invoke(command, inputs)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert said.splitlines()[-1] == ("interrupted" if out is None else f"interrupted; {out} left as it was")
    after = {str(p.relative_to(workdir)): p.read_text() for p in workdir.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in workdir.iterdir()) == sorted({n.split("/")[0] for n in old})
