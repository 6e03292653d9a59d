"""`headlab audit` through typer's CliRunner: verdict and tables, JSON, and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlab.audit import audit
from headlab.audit.examples import SliceSharedAttention
from headlab.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "src" / "headlab" / "audit" / "examples"
LAYERS = ROOT / "tests" / "support" / "layers.py"
WIDE = {"COLUMNS": "250"}


def _run(*args: str):
    return runner.invoke(app, ["audit", *args], env=WIDE)


def _flat(text: str) -> str:
    return " ".join(text.split())  # undo the error box's line wrapping


def test_verdict_lines_come_first_then_the_evidence_tables() -> None:
    result = _run(f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", "--init", '{"embed_size": 32, "heads": 4}')
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("SliceSharedAttention (")
    torch.manual_seed(0)  # as the command does (--seed 0) before it builds the module: the same weights
    expected = audit(SliceSharedAttention(embed_size=32, heads=4)).verdict
    assert [line[2:] for line in lines[1 : 1 + len(expected)]] == expected
    assert lines[1].startswith("• 4 heads of size 8") and "share one 8×8 query, key and value projection" in lines[2]
    rest = "\n".join(lines[1 + len(expected):])
    assert rest.index("Per head") < rest.index("Measurements")
    assert "slice 3 [24:32)" in rest and "forward(values, keys, query, mask)" in rest


def test_json_is_one_document_with_the_verdict_fields() -> None:
    result = _run(f"{EXAMPLES / 'torch_mha.py'}:MultiheadAttention", "--init", '{"embed_dim": 16, "num_heads": 4}',
                  "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is the document
    assert (doc["n_heads"], doc["n_kv_heads"], doc["d_head"], doc["reads"], doc["shared"], doc["causal"]) == (
        4, 4, 4, "wide", False, False)
    assert doc["batch_first"] is False and doc["call"] == "qkv" and doc["qk_ranks"] == [4] * 4
    assert doc["parameters"] == {"module": 1088, "standard": 1088, "variant": 1088, "variant_name": "wide"}
    assert doc["equivalent"]["verified"] is True and doc["verdict"][-1].startswith("equivalent headlab layer")
    assert len(doc["heads"]) == 4 and doc["heads"][0]["reads_q"]["kind"] == "wide"


def test_call_and_d_model_options() -> None:
    ok = _run(f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", "--call", "vkq", "--d-model", "64", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["call_signature"] == "forward(values, keys, query, mask)"
    parameterless = _run(f"{LAYERS}:Parameterless", "--d-model", "6", "--json")
    assert parameterless.exit_code == 0, parameterless.output
    assert json.loads(parameterless.stdout)["d_model"] == 6


@pytest.mark.parametrize(("target", "args", "fragments"), [
    ("Raises", [], ["error:", "forward(x) raised ValueError: boom: this layer is broken"]),
    ("NoSoftmax", [], ["error:", "ran but computed no softmax"]),
    ("WrongShape", [], ["error:", "forward(x) returned shape (1, 5, 4); expected (1, 5, 8)"]),
    ("TwoAttentions", [], ["error:", "computed 2 attention operations in one forward"]),
])
def test_module_failures_exit_1_with_a_message_not_a_traceback(target: str, args: list[str], fragments) -> None:
    result = _run(f"{LAYERS}:{target}", *args)
    assert result.exit_code == 1, result.output
    text = _flat(result.output)
    for fragment in fragments:
        assert fragment in text, text
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.parametrize(("target", "args", "fix"), [
    (f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", ["--call", "self"],
     "to fix: leave out call='self' (drop --call) to let the audit find how to call it"),
    (f"{LAYERS}:PerHeadWeights", [], "to fix: if its input width is none of 8, 4, 3, pass it (--d-model N)"),
    (f"{LAYERS}:NeedsPositions", [], "build, in Python, a module whose forward supplies them (--factory "
                                     "module:function)"),
])
def test_a_module_that_cannot_be_called_gets_one_line_naming_the_fix(target: str, args: list[str], fix: str) -> None:
    result = _run(target, *args)
    assert result.exit_code == 1, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: could not audit ")
    assert result.output.rstrip().endswith(fix), result.output


def test_the_fixes_named_work() -> None:
    width = _run(f"{LAYERS}:PerHeadWeights", "--d-model", "32", "--json")
    assert width.exit_code == 0, width.output
    assert (json.loads(width.stdout)["n_heads"], json.loads(width.stdout)["reads"]) == (4, "narrow")
    factory = _run(f"{LAYERS}:PerHeadWeights", "--factory", "layers:make_per_head", "--init", '{"width": 16}',
                   "--d-model", "16", "--json")
    assert factory.exit_code == 0, factory.output
    assert (json.loads(factory.stdout)["d_model"], json.loads(factory.stdout)["n_heads"]) == (16, 2)


def test_config_object_constructors_are_built_from_nested_init() -> None:
    llama = _run(f"{EXAMPLES / 'llama_rotary.py'}:Attention", "--init",
                 '{"args": {"dim": 32, "n_heads": 4, "n_kv_heads": 1}}', "--json")  # a ModelArgs dataclass
    assert llama.exit_code == 0, llama.output
    doc = json.loads(llama.stdout)
    assert (doc["d_model"], doc["n_heads"], doc["n_kv_heads"], doc["computed_in"]) == (32, 4, 1, "float32")
    plain = _run(f"{LAYERS}:ConfigAttention", "--init", '{"config": {"width": 16, "heads": 2}}', "--json")
    assert plain.exit_code == 0, plain.output  # unannotated: a SimpleNamespace
    assert json.loads(plain.stdout)["n_heads"] == 2


@pytest.mark.parametrize(("args", "fragments"), [
    ([f"{EXAMPLES / 'llama_rotary.py'}:Attention"],
     ["Attention(args) needs args, a ModelArgs: give its fields as a nested JSON object, e.g. --init "
      '\'{"args": {"dim": 64, "n_heads": 4, "n_kv_heads": 2}}\'', "--factory module:function"]),
    ([f"{LAYERS}:ConfigAttention"],
     ['an object such as \'{"config": {"FIELD": VALUE}}\' becomes a types.SimpleNamespace', "--factory"]),
    ([f"{LAYERS}:ConfigAttention", "--init", '{"config": {"width": 16}}'],
     ['ConfigAttention reads config.heads, which --init does not give: add "heads" to the "config" object']),
    ([f"{LAYERS}:PerHeadWeights", "--factory", "layers:nope"],
     ["--factory 'layers:nope': layers defines no function 'nope'; functions in it: make_per_head"]),
    ([f"{LAYERS}:PerHeadWeights", "--factory", "nocolon"], ["--factory 'nocolon' is not module:function"]),
])
def test_constructor_problems_exit_2_naming_what_to_give(args: list[str], fragments: list[str]) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize(("args", "kind", "code"), [
    ([f"{LAYERS}:Raises"], "raised", 1),
    ([f"{LAYERS}:TwoAttentions"], "several-attention", 1),
    ([f"{LAYERS}:ConfigAttention"], "bad-argument", 2),
    ([f"{LAYERS}:Raises", "--call", "sideways"], "bad-argument", 2),
    (["nothing-here"], "bad-argument", 2),
])
def test_json_prints_an_error_object_on_failure(args: list[str], kind: str, code: int) -> None:
    result = _run(*args, "--json")
    assert result.exit_code == code, result.output
    error = json.loads(result.stdout)["error"]
    assert (error["kind"], error["exit_status"]) == (kind, code) and "\n" not in error["message"]


def test_per_head_numbers_are_never_broken_at_80_columns() -> None:
    from headlab.audit.tables import head_table

    result = runner.invoke(app, ["audit", f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    torch.manual_seed(0)
    _, rows = head_table(audit(SliceSharedAttention()))
    for token in {t for row in rows for cell in row for t in cell.split() if any(c.isdigit() for c in t)}:
        assert any(token in line for line in lines), f"{token!r} is broken across lines"


@pytest.mark.parametrize(("args", "fragments"), [
    (["layer.py"], ["PATH.py:ClassName", "is not PATH.py:ClassName"]),
    ([f"{ROOT / 'nope.py'}:X"], ["is not a file"]),
    ([f"{EXAMPLES / 'slice_shared.py'}:Missing"], ["defines no 'Missing'", "SliceSharedAttention"]),
    ([f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", "--init", "{heads: 2}"], ["--init", "is not valid JSON"]),
    ([f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", "--init", '{"bogus": 1}'],
     ["--init", "unexpected keyword argument 'bogus'"]),
    ([f"{EXAMPLES / 'slice_shared.py'}:SliceSharedAttention", "--call", "kvq"],
     ["--call", "'kvq' is not one of self, qkv, vkq"]),
    ([f"{LAYERS}:Parameterless"], ["--d-model", "cannot infer d_model"]),
    ([f"{LAYERS}:Parameterless", "--d-model", "0"], ["--d-model"]),
])
def test_bad_arguments_exit_2(args: list[str], fragments: list[str]) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.output
    text = _flat(result.output)
    for fragment in fragments:
        assert fragment in text, text
    assert "Traceback" not in result.output


def test_help_says_the_file_is_executed_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "layer.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    result = runner.invoke(app, ["audit", "--help"], env=WIDE)
    assert result.exit_code == 0
    assert "EXECUTED" in result.output and "audit only files you trust" in _flat(result.output)
    for option in ("--init", "--call", "--d-model", "--json", "--seed"):
        assert option in result.output
    assert "audit" in runner.invoke(app, ["--help"]).output
    assert not marker.exists()
