"""`headlab params` through typer's CliRunner: table, JSON, explanations, usage errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import account
from headlab.layer.presets import GQA_GROUP_SIZE, PRESETS, check_presets, preset_config
from headlab.layer.projections import PROJECTIONS
from headlab.report.sections.params import explain

runner = CliRunner()
HEADS = (1, 2, 4, 8, 16)


def _table_rows(output: str) -> dict[tuple[str, int], list[str]]:
    """(variant, heads) → the row's remaining cells, from rich's box-drawn table."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 8 and cells[0] in PRESETS:
            rows[(cells[0], int(cells[1]))] = cells[2:]
    return rows


def test_table_has_a_row_per_variant_and_heads_with_the_accounted_numbers() -> None:
    result = runner.invoke(app, ["params", "--d-model", "512", "--n-heads", "1,2,4,8,16", "--seq", "64"])
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.stdout)
    assert set(rows) == {(v, h) for v in PRESETS for h in HEADS}
    for (variant, h), cells in rows.items():
        acc = account(preset_config(variant, d_model=512, n_heads=h), seq_len=64)
        kv_heads, _, parameters, per_head, flops, rank = cells
        assert kv_heads == str(acc.config.n_kv_heads)
        assert parameters == f"{acc.total_parameters:,}"
        assert per_head.replace(",", "") == f"{acc.parameters_per_head:.0f}"
        assert flops == f"{acc.total_flops:,}"
        assert rank == str(acc.qk_rank_bound)
    assert "softmax" in result.stdout  # the FLOP convention is stated
    assert "skipped" not in result.stdout


def test_json_is_one_document_matching_account() -> None:
    result = runner.invoke(app, ["params", "--d-model", "64", "--n-heads", "2,8", "--variants", "wide,bilinear",
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is the document
    assert (doc["d_model"], doc["seq_len"], doc["skipped"]) == (64, 128, [])
    assert "explanations" not in doc
    assert [(r["variant"], r["n_heads"]) for r in doc["rows"]] == [("wide", 2), ("wide", 8), ("bilinear", 2),
                                                                    ("bilinear", 8)]
    for row in doc["rows"]:
        acc = account(preset_config(row["variant"], d_model=64, n_heads=row["n_heads"]), seq_len=128)
        assert row["parameters"] == acc.parameters
        assert row["flops"] == acc.flops
        assert row["total_parameters"] == acc.total_parameters
        assert row["total_flops"] == acc.total_flops
        assert row["parameters_per_head"] == acc.parameters_per_head
        assert row["qk_rank_bound"] == acc.qk_rank_bound
        assert (row["n_kv_heads"], row["d_head"], row["d_head_v"]) == (
            acc.config.n_kv_heads, acc.config.d_head, acc.config.d_head_v)
    assert doc["rows"][2]["qk_dim"] == 64 and doc["rows"][1]["qk_dim"] == 8  # bilinear: kdim; wide: d_head


def test_explain_prints_one_sentence_per_variant_with_the_computed_numbers() -> None:
    result = runner.invoke(app, ["params", "--variants", "wide,shared,bilinear", "--explain"],
                           env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for name in ("wide", "shared", "bilinear"):
        rows = [account(preset_config(name, d_model=512, n_heads=h)) for h in HEADS]
        assert f"{name}: {explain(name, rows)}" in result.stdout
    assert "stay at 1,050,624 for 1–16 heads" in result.stdout
    assert "fall from 1,050,624 at 1 head to 265,824 at 16 heads" in result.stdout


def test_json_with_explain_carries_the_sentences() -> None:
    result = runner.invoke(app, ["params", "--n-heads", "1,4", "--json", "--explain"])
    doc = json.loads(result.stdout)
    assert set(doc["explanations"]) == set(PRESETS)
    rows = [account(preset_config("shared", d_model=512, n_heads=h)) for h in (1, 4)]
    assert doc["explanations"]["shared"] == explain("shared", rows)


def test_default_run_skips_unusable_pairs_and_reports_them() -> None:
    # d_model=24: 16 heads do not divide it, so every variant skips n_heads=16.
    result = runner.invoke(app, ["params", "--d-model", "24", "--n-heads", "2,16"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert set(_table_rows(result.stdout)) == {(v, 2) for v in PRESETS}
    for variant in PRESETS:
        assert re.search(rf"skipped {re.escape(variant)} at n_heads=16: .*n_heads=16 does not divide d_model=24",
                         result.stdout)
    as_json = runner.invoke(app, ["params", "--d-model", "24", "--n-heads", "2,16", "--json"])
    doc = json.loads(as_json.stdout)
    assert [(s["variant"], s["n_heads"]) for s in doc["skipped"]] == [(v, 16) for v in PRESETS]
    assert "skipped wide at n_heads=16" in as_json.stderr  # also said on stderr, stdout stays pure JSON


def _usage_error(args: list[str]) -> str:
    result = runner.invoke(app, ["params", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())  # undo the error box's line wrapping


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--variants", "wide,bogus,nope"], ["--variants", "'bogus', 'nope'", "known variants: wide, narrow, shared"]),
        (["--variants", "wide,wide"], ["--variants", "variants lists wide more than once"]),
        (["--n-heads", "1,x"], ["--n-heads", "'x' is not a positive int", "'1,x'"]),
        (["--n-heads", "0"], ["--n-heads", "'0' is not a positive int"]),
        (["--n-heads", "-4"], ["--n-heads", "'-4' is not a positive int"]),
        (["--n-heads", "2.5"], ["--n-heads", "'2.5' is not a positive int"]),
        (["--n-heads", ""], ["--n-heads", "'' is not a positive int"]),
        (["--n-heads", "4,4"], ["--n-heads", "4 is listed more than once"]),
        (["--seq", "0"], ["--seq"]),
        (["--d-model", "0"], ["--d-model"]),
        (["--variants", "narrow,wide", "--n-heads", "4,3"],
         ["variant 'narrow' cannot use n_heads=3", "variant 'wide' cannot use n_heads=3",
          "does not divide d_model=512"]),
        (["--variants", "grouped-query", "--d-model", "72", "--n-heads", "9"],
         ["variant 'grouped-query' cannot use n_heads=9", "n_kv_heads=2 does not divide n_heads=9"]),
        (["--d-model", "7", "--n-heads", "2"], ["no variant can use n_heads 2 at d_model=7"]),
        (["--d-model", "1000000000", "--variants", "wide", "--n-heads", "1"],
         ["--d-model", "d_model=1000000000", "too large for torch to describe"]),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], fragments: list[str]) -> None:
    message = _usage_error(args)
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("text", ["wide,bogus,nope", "wide,wide", "nope"])
def test_variant_errors_are_the_librarys_check(text: str) -> None:
    with pytest.raises(ValueError, match="variant") as library:
        check_presets(text.split(","))
    assert " ".join(str(library.value).split()) in _usage_error(["--variants", text])


# The layer a user gets by naming each preset: the projection variants are AttentionConfig(projection=v).
USER_CONFIG = {
    **{v: lambda d, h, v=v: AttentionConfig(d_model=d, n_heads=h, projection=v) for v in PROJECTIONS},
    "grouped-query": lambda d, h: AttentionConfig(d_model=d, n_heads=h, n_kv_heads=max(1, h // GQA_GROUP_SIZE)),
    "multi-query": lambda d, h: AttentionConfig(d_model=d, n_heads=h, n_kv_heads=1),
    "talking-heads": lambda d, h: AttentionConfig(d_model=d, n_heads=h, talking_heads=True),
}


@pytest.mark.parametrize("variant", PRESETS)
def test_json_counts_the_layer_the_config_builds(variant: str) -> None:
    assert set(USER_CONFIG) == set(PRESETS)
    result = runner.invoke(app, ["params", "--d-model", "64", "--n-heads", "1,4,16", "--variants", variant, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [r["n_heads"] for r in rows] == [1, 4, 16]
    for row in rows:
        layer = MultiHeadAttention(USER_CONFIG[variant](64, row["n_heads"]))
        assert row["total_parameters"] == sum(p.numel() for p in layer.parameters())
        assert row["parameters"] == {name: p.numel() for name, p in layer.named_parameters()}
        assert (row["d_head"], row["d_head_v"], row["n_kv_heads"]) == (
            layer.config.d_head, layer.config.d_head_v, layer.config.n_kv_heads)


def test_collaborative_row_is_the_layer_the_issue_builds() -> None:
    # d_model 64, 4 heads: AttentionConfig(projection="collaborative") shares a width D = d_head = 16.
    result = runner.invoke(app, ["params", "--d-model", "64", "--n-heads", "4", "--variants", "collaborative",
                                 "--json"])
    (row,) = json.loads(result.stdout)["rows"]
    assert (row["total_parameters"], row["d_head"], row["qk_dim"]) == (10_464, 16, 16)


def test_help_lists_params_and_its_options() -> None:
    assert "params" in runner.invoke(app, ["--help"]).output
    sub = runner.invoke(app, ["params", "--help"], env={"COLUMNS": "200"})
    assert sub.exit_code == 0
    for option in ("--d-model", "--n-heads", "--variants", "--seq", "--json", "--explain"):
        assert option in sub.output


def test_the_worked_example_in_the_docs_is_what_the_command_prints() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "params.md").read_text(encoding="utf-8")
    command = "headlab params --d-model 64 --n-heads 1,4 --variants wide,shared --seq 16 --json --explain"
    block = re.search(rf"\$ {re.escape(command)}\n(.*?)\n```", docs, re.DOTALL)
    assert block, "the worked example is missing from docs/params.md"
    result = runner.invoke(app, command.split()[1:])
    assert json.loads(block.group(1)) == json.loads(result.stdout)


def test_a_narrow_terminal_never_truncates_a_number() -> None:
    result = runner.invoke(app, ["params", "--n-heads", "1,16"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    rows = _table_rows(result.stdout)
    acc = account(preset_config("bilinear", d_model=512, n_heads=16))
    assert rows[("bilinear", 16)][2:5] == [f"{acc.total_parameters:,}", f"{acc.parameters_per_head:,.0f}",
                                           f"{acc.total_flops:,}"]
