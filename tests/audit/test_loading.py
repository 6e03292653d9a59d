"""Loading PATH.py:ClassName with --init keyword arguments; the file is executed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from headlab.audit import AuditError, LoadError, load_module
from headlab.audit.loading import parse_init, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "headlab" / "audit" / "examples"


def test_an_example_file_loads_with_init() -> None:
    module = load_module(f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", init={"embed_size": 32, "heads": 2})
    assert type(module).__name__ == "SliceSharedAttention" and module.head_dim == 16
    mha = load_module(f"{EXAMPLES / 'torch_mha.py'}:MultiheadAttention", init={"embed_dim": 16, "num_heads": 4})
    assert mha.num_heads == 4


def test_the_file_may_import_its_neighbours_and_sys_path_is_restored(tmp_path: Path) -> None:
    (tmp_path / "helper_for_audit.py").write_text("WIDTH = 12\n")
    (tmp_path / "layer.py").write_text(
        "import torch\nfrom helper_for_audit import WIDTH\n"
        "class L(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.p = torch.nn.Linear(WIDTH, WIDTH)\n")
    before = list(sys.path)
    assert load_module(f"{tmp_path / 'layer.py'}:L").p.in_features == 12
    assert sys.path == before


@pytest.mark.parametrize("spec", ["layer.py", "layer:Class", "layer.py:", "layer.py:not-a-name"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(LoadError, match=r"is not PATH.py:ClassName"):
        parse_spec(spec)


@pytest.mark.parametrize(("text", "error"), [
    ("{embed_dim: 64}", "is not valid JSON"), ("[1, 2]", "is JSON list; expected an object"),
])
def test_bad_init(text: str, error: str) -> None:
    with pytest.raises(LoadError, match=error):
        parse_init(text)
    assert parse_init(None) == {} and parse_init('{"a": 1}') == {"a": 1}


def test_missing_file_and_class(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="is not a file"):
        load_module(f"{tmp_path / 'nope.py'}:X")
    with pytest.raises(LoadError, match=r"defines no 'Missing'; nn.Module classes in it: .*SliceSharedAttention"):
        load_module(f"{EXAMPLES / 'slice_shared.py'}:Missing")
    (tmp_path / "f.py").write_text("NOT_A_CLASS = 3\n")
    with pytest.raises(LoadError, match=r"NOT_A_CLASS in .* is a int, not a torch\.nn\.Module subclass"):
        load_module(f"{tmp_path / 'f.py'}:NOT_A_CLASS")


def test_constructor_refusing_the_arguments_is_a_load_error() -> None:
    with pytest.raises(LoadError, match=r"unexpected keyword argument 'bogus'.*check --init"):
        load_module(f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", init={"bogus": 1})


def test_user_code_raising_is_an_audit_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("raise RuntimeError('import-time failure')\n")
    with pytest.raises(AuditError, match=r"executing .*bad\.py raised RuntimeError: import-time failure") as info:
        load_module(f"{tmp_path / 'bad.py'}:X")
    assert info.value.kind == "raised"


@pytest.mark.parametrize(("source", "match"), [
    ("import sys\nsys.exit(3)\n",
     r"bad\.py called sys\.exit\(3\) while being imported; expected a file that defines X"),
    ("import torch\nclass X(torch.nn.Module):\n    def __init__(self):\n        raise SystemExit('no')\n",
     r"X\(\*\*\{\}\) in .*bad\.py called sys\.exit\('no'\) while being built"),
])
def test_user_code_calling_sys_exit_is_an_audit_error_naming_the_file(tmp_path: Path, source: str,
                                                                      match: str) -> None:
    (tmp_path / "bad.py").write_text(source)
    with pytest.raises(AuditError, match=match) as info:
        load_module(f"{tmp_path / 'bad.py'}:X")
    assert info.value.kind == "raised"
