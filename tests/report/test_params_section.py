"""The parameters section: renders, its numbers are account()'s, its plot and JSON are written."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

import headlab.report.sections as registry
from headlab.layer.accounting import Accounting, account, sweep
from headlab.layer.presets import PRESETS, preset_config
from headlab.report import Part, build_report
from headlab.report.sections.params import (
    D_MODEL,
    HEADS,
    JSON_NAME,
    PLOT_NAME,
    SECTION,
    SEQ_LEN,
    explain,
    make_params_section,
    params_document,
    render_params,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report")
    result = build_report(out, sections=[SECTION], progress=False)
    assert result.sections[0].ok, result.sections[0].error
    return out, result.index.read_text(encoding="utf-8")


def _section(page: str) -> str:
    return page[page.index('id="params"') : page.index('id="provenance"')]


def test_section_is_registered_with_its_title() -> None:
    parts = [e for e in registry.DEFAULT_SECTIONS if isinstance(e, Part)]
    assert any(SECTION in p.sections for p in parts)
    assert SECTION.title == "Parameters and FLOPs by variant and number of heads"


def test_table_numbers_are_accounts(built: tuple[Path, str]) -> None:
    body = _section(built[1])
    rows = re.findall(r"<tr><td><code>([a-z-]+)</code></td>(.*?)</tr>", body)
    cells = {(v, int(re.findall(r'<td class="num">([^<]*)</td>', r)[0])): re.findall(r'<td class="num">([^<]*)</td>', r)
             for v, r in rows}
    assert set(cells) == {(v, h) for v in PRESETS for h in HEADS}
    for (variant, h), row in cells.items():
        acc = account(preset_config(variant, d_model=D_MODEL, n_heads=h), seq_len=SEQ_LEN)
        assert row[1] == str(acc.config.n_kv_heads)
        assert row[3] == f"{acc.total_parameters:,}"
        assert row[5] == f"{acc.total_flops:,}"
        assert row[6] == str(acc.qk_rank_bound)


def test_prose_answers_the_three_questions_with_computed_sentences(built: tuple[Path, str]) -> None:
    text = html.unescape(_section(built[1]))
    for question in ("Do more heads mean more parameters?", "Do heads share weights?",
                     "Why separate W_Q and W_K instead of one W_QK?"):
        assert question in text
    for name in PRESETS:
        rows = [account(preset_config(name, d_model=D_MODEL, n_heads=h), seq_len=SEQ_LEN) for h in HEADS]
        assert text.count(explain(name, rows)) == 1, name  # each sentence once: in its question's answer or the list
    # The wide rows are checked against torch.nn.MultiheadAttention built at the same sizes.
    assert "torch.nn.MultiheadAttention(512, h) has " + ", ".join(["1,050,624"] * 5) in text
    assert "the same as the wide rows" in text
    assert "The separate factors are the cheaper of the two at 4, 8, 16 heads" in text


def test_plot_and_json_are_written_and_linked(built: tuple[Path, str]) -> None:
    out, page = built
    svg = (out / PLOT_NAME).read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for name in PRESETS:  # one legend entry per variant
        assert name in svg
    assert f'src="{PLOT_NAME}"' in page
    doc = json.loads((out / JSON_NAME).read_text(encoding="utf-8"))
    assert doc == json.loads(json.dumps(params_document(sweep(d_model=D_MODEL, n_heads=HEADS, seq_len=SEQ_LEN))))
    assert set(doc["explanations"]) == set(PRESETS)
    assert f'href="{JSON_NAME}"' in page


def test_plot_is_reproducible() -> None:
    from headlab.report.sections.params import plot_parameters

    result = sweep(d_model=64, n_heads=[1, 2, 4], variants=["wide", "shared"])
    assert plot_parameters(result) == plot_parameters(result)


def test_a_torch_count_that_disagrees_is_said(tmp_path: Path) -> None:
    section = make_params_section(d_model=32, heads=(1, 2), torch_count=lambda d, h: 7)
    result = build_report(tmp_path, sections=[section], progress=False)
    assert result.sections[0].ok, result.sections[0].error
    assert "has 7, 7 parameters for h = 1, 2: these differ from the wide rows" in result.index.read_text()


def test_skipped_pairs_are_shown_and_an_empty_sweep_is_an_error() -> None:
    partial = sweep(d_model=24, n_heads=[2, 16], variants=["wide", "shared"])
    fragment = html.unescape(render_params(partial))
    assert "Skipped: wide at n_heads=16 (" in fragment and "shared at n_heads=16 (" in fragment
    with pytest.raises(ValueError, match="no rows"):
        render_params(sweep(d_model=24, n_heads=[16], variants=["wide"]))


# --- the sentences: one home, here; `headlab params --explain` shows the same -----------------------

def _rows(name: str, heads=(1, 2, 4, 8, 16), d_model: int = 512) -> list[Accounting]:
    return [account(preset_config(name, d_model=d_model, n_heads=h)) for h in heads]


def test_explain_wide_states_the_constant_total_and_the_budget() -> None:
    rows = _rows("wide")
    sentence = explain("wide", rows)
    assert sentence.startswith(f"Parameters stay at {rows[0].total_parameters:,} for 1–16 heads")
    assert f"{4 * 512 * 512:,}" in sentence and "512 to 32" in sentence
    assert sentence.count(".") == 1 and sentence.endswith(".")  # one sentence


def test_explain_shared_and_bilinear_give_their_computed_numbers() -> None:
    shared = _rows("shared")
    s = explain("shared", shared)
    assert f"fall from {shared[0].total_parameters:,} at 1 head to {shared[-1].total_parameters:,} at 16 heads" in s
    assert f"{512 * 512:,} to {(512 // 16) ** 2:,}" in s  # (d_model/h)² per projection
    bilinear = _rows("bilinear")
    b = explain("bilinear", bilinear)
    assert f"grow from {bilinear[0].total_parameters:,}" in b
    assert f"{512 * 512:,} to {16 * 512 * 512:,}" in b  # h·d_model² for the query-key forms
    assert f"{2 * 512 * 512:,} to {2 * 512 * 32:,}" in b  # 2·d_model·d_head per wide head


def test_explain_collaborative_names_the_shared_width_the_config_builds() -> None:
    rows = _rows("collaborative")
    sentence = explain("collaborative", rows)
    assert "width D = d_head = d_model/h = 512 to 32" in sentence
    assert f"2·d_model·D = {2 * 512 * 512:,} to {2 * 512 * 32:,} weights" in sentence
    assert f"2·d_model² = {2 * 512 * 512:,})" in sentence
    assert "(512 in all)" in sentence  # h mixing vectors of D = d_model/h weights
    assert sentence.startswith(f"Parameters fall from {rows[0].total_parameters:,} at 1 head")


def test_explain_computes_the_trend() -> None:
    gqa = _rows("grouped-query")
    assert f"to {gqa[2].total_parameters:,} at 4 heads, then stay there up to 16 heads" in explain("grouped-query", gqa)
    assert "n_kv_heads = 1, 1, 1, 2, 4" in explain("grouped-query", gqa)
    assert explain("multi-query", _rows("multi-query")).startswith("Parameters fall from")
    assert explain("talking-heads", _rows("talking-heads")).startswith("Parameters grow from")
    one = _rows("wide", heads=(4,))
    assert explain("wide", one).startswith(f"Parameters are {one[0].total_parameters:,} at 4 heads")
    # The order of the rows does not matter: the sentence sorts by heads.
    assert explain("shared", _rows("shared")[::-1]) == explain("shared", _rows("shared"))


def test_explain_refuses_rows_of_another_preset() -> None:
    with pytest.raises(ValueError, match="'shared' preset"):
        explain("shared", _rows("wide", heads=(2, 4)))
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        explain("nope", _rows("wide", heads=(2,)))
    with pytest.raises(ValueError, match="at least one row"):
        explain("wide", [])
