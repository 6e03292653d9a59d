"""The JSON document, its documentation, and the sentences and tables made from the fields."""

from __future__ import annotations

import json
import re
from pathlib import Path

from headlab.audit.tables import head_table, measurement_table
from headlab.audit.verdict import config_text
from headlab.layer import AttentionConfig

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text(encoding="utf-8")


def _documented() -> set[str]:
    """Every field name in the schema table's first column (``a.b`` and ``a[].b`` forms included)."""
    schema = DOCS[DOCS.index("## JSON schema"):DOCS.index("## Limits")]
    names = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", schema, re.MULTILINE):
        for name in re.findall(r"`([^`]+)`", row):
            names.add(name.split(".")[-1])
    return names


def _keys(value, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key)
            if key != "config":  # the equivalent layer's AttentionConfig fields are headlab's own
                _keys(item, out)
    elif isinstance(value, list):
        for item in value:
            _keys(item, out)
    return out


def test_every_json_field_is_documented(example_audits) -> None:
    documented = _documented()
    for name, (_, result) in example_audits.items():
        doc = json.loads(json.dumps(result.to_dict()))
        missing = _keys(doc, set()) - documented
        assert not missing, f"{name}: undocumented fields {sorted(missing)}"
        assert {result.layout, result.variant} <= set(re.findall(r"`([a-z-]+)`", DOCS))


def test_config_text_names_only_what_differs_from_the_defaults() -> None:
    assert config_text(AttentionConfig(d_model=64, n_heads=8).to_dict()) == "AttentionConfig(d_model=64, n_heads=8)"
    c = AttentionConfig(d_model=48, n_heads=4, d_head=6, n_kv_heads=2, kv_head_of=(0, 1, 1, 0), d_head_v=5,
                        causal=True)
    assert config_text(c.to_dict()) == ("AttentionConfig(d_model=48, n_heads=4, d_head=6, n_kv_heads=2, "
                                        "kv_head_of=(0, 1, 1, 0), d_head_v=5, causal=True)")


def test_tables_have_one_row_per_head_and_every_measurement(example_audits) -> None:
    _, result = example_audits["grouped_query"]
    headers, rows = head_table(result)
    assert len(rows) == 8 and all(len(r) == len(headers) for r in rows)
    assert rows[5][:5] == ["5", "all 64", "8", "8", "1"]
    headers, rows = measurement_table(result)
    assert headers == ["measurement", "value", "how"]
    assert rows[0][1] == "torch.softmax" and rows[-1][1] == f"{result.equivalent.max_abs_diff:.1e}"


def test_verdict_lines_quote_the_measured_numbers(example_audits) -> None:
    _, result = example_audits["fused_causal"]
    assert result.verdict == [
        "4 heads of size 16; each head reads all 64 input dimensions (queries, keys and values)",
        f"the heads do not share their query-key forms: each head's W_QK differs from head 0's (smallest difference: "
        f"{min(h.qk_difference for h in result.heads[1:]):.2g} × the largest entry)",
        "each head's W_QK has rank 16 (at most d_head = 16)",
        "causal: changing only the last input leaves every earlier output unchanged",
        "this is standard multi-head attention (Vaswani et al. 2017)",
        "16,640 parameters, against 16,640 for the standard layer with d_model 64 and 4 heads and 16,640 for "
        "headlab's 'wide' variant",
        f"equivalent headlab layer: MultiHeadAttention(AttentionConfig(d_model=64, n_heads=4, causal=True)) with the "
        f"recovered weights reproduces its outputs (largest difference {result.equivalent.max_abs_diff:.1e})",
    ]
