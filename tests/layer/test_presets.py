"""Named presets and sweeps of them: each preset is the layer a user gets, and it is counted as built."""

from __future__ import annotations

import re

import pytest
import torch

from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import account, sweep
from headlab.layer.presets import GQA_GROUP_SIZE, PRESETS, check_presets, preset_config
from headlab.layer.projections import PROJECTIONS

# What each preset is, spelled as a user would: the projection variants are AttentionConfig(projection=v).
AS_A_USER_WRITES = {
    **{v: {"projection": v} for v in PROJECTIONS},
    "grouped-query": {"n_kv_heads": lambda h: max(1, h // GQA_GROUP_SIZE)},
    "multi-query": {"n_kv_heads": lambda h: 1},
    "talking-heads": {"talking_heads": True},
}


def _as_a_user_writes(name: str, d_model: int, n_heads: int) -> AttentionConfig:
    fields = {k: v(n_heads) if callable(v) else v for k, v in AS_A_USER_WRITES[name].items()}
    return AttentionConfig(d_model=d_model, n_heads=n_heads, **fields)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_the_config_a_user_writes(name: str) -> None:
    assert set(AS_A_USER_WRITES) == set(PRESETS)
    for h in (1, 2, 4, 8, 16):
        assert preset_config(name, d_model=64, n_heads=h) == _as_a_user_writes(name, 64, h)


@pytest.mark.parametrize("name", PRESETS)
def test_sweep_counts_the_layer_the_config_builds(name: str) -> None:
    result = sweep(d_model=64, n_heads=[1, 4, 16], variants=[name], seq_len=8)
    assert not result.skipped
    for row in result.rows:
        layer = MultiHeadAttention(_as_a_user_writes(name, 64, row.accounting.config.n_heads))
        built = {n: p.numel() for n, p in layer.named_parameters()}
        assert row.accounting.parameters == built
        assert row.accounting.total_parameters == sum(p.numel() for p in layer.parameters())


def test_collaborative_is_counted_at_the_width_the_config_builds() -> None:
    # The case: d_model 64, 4 heads. AttentionConfig(projection="collaborative") shares
    # a query/key space of width D = d_head = 16, so the layer has 10,464 parameters.
    config = preset_config("collaborative", d_model=64, n_heads=4)
    layer = MultiHeadAttention(AttentionConfig(d_model=64, n_heads=4, projection="collaborative"))
    assert config.d_head == 16 and layer.projection.q_weight.shape == (16, 64)
    assert account(config).total_parameters == sum(p.numel() for p in layer.parameters()) == 10_464


def test_collaborative_at_d_model_width_starts_as_the_standard_layer() -> None:
    # The block-partition mixing gives head h the shared dimensions [h·d/h, (h+1)·d/h): with D = d_model,
    # copying those rows into a wide layer's W_Q, W_K gives the same outputs (scale 1/sqrt(d/h)).
    d, h = 24, 4
    config = AttentionConfig(d_model=d, n_heads=h, projection="collaborative", d_head=d, d_head_v=d // h,
                             scale=(d // h) ** -0.5)
    collab = MultiHeadAttention(config).double()
    wide = MultiHeadAttention(preset_config("wide", d_model=d, n_heads=h)).double()
    p, w = collab.projection, wide.projection
    with torch.no_grad():
        for bias in (p.q_bias, p.k_bias, p.v_bias):
            bias.normal_()
        w.in_proj_weight.copy_(torch.cat([p.q_weight, p.k_weight, p.v_weight]))
        w.in_proj_bias.copy_(torch.cat([p.q_bias, p.k_bias, p.v_bias]))
        w.out_proj.load_state_dict(p.out_proj.state_dict())
    x = torch.randn(2, 5, d, dtype=torch.float64)
    torch.testing.assert_close(collab(x), wide(x), atol=1e-12, rtol=1e-12)


def test_sweep_reports_pairs_a_preset_cannot_build() -> None:
    result = sweep(d_model=12, n_heads=[8, 1, 3], variants=["narrow", "wide", "multi-query"], seq_len=4)
    pairs = [(r.variant, r.accounting.config.n_heads) for r in result.rows]
    assert pairs == [("narrow", 1), ("narrow", 3), ("wide", 1), ("wide", 3), ("multi-query", 1), ("multi-query", 3)]
    assert [(s.variant, s.n_heads) for s in result.skipped] == [("narrow", 8), ("wide", 8), ("multi-query", 8)]
    assert all("n_heads=8" in s.reason and "d_model=12" in s.reason for s in result.skipped)
    doc = result.to_dict()
    assert doc["skipped"][0] == {"variant": "narrow", "n_heads": 8, "reason": result.skipped[0].reason}
    assert doc["rows"][0]["total_parameters"] == result.rows[0].accounting.total_parameters
    assert set(result.by_variant()) == {"narrow", "wide", "multi-query"}


def test_preset_config_errors_name_the_preset_and_sizes() -> None:
    with pytest.raises(ValueError, match="unknown variant 'wid'; known variants: wide, narrow, shared"):
        preset_config("wid", d_model=8, n_heads=2)
    for name in ("narrow", "shared", "wide", "collaborative"):
        with pytest.raises(ValueError, match=re.escape(f"variant {name!r} with d_model=30, n_heads=4: ")):
            preset_config(name, d_model=30, n_heads=4)
    for name in PRESETS:
        with pytest.raises(ValueError, match=re.escape(f"variant {name!r} with d_model=8, n_heads=0: n_heads=0 must")):
            preset_config(name, d_model=8, n_heads=0)
    with pytest.raises(ValueError,
                       match=r"'grouped-query' with d_model=72, n_heads=9: n_kv_heads=2 does not divide n_heads=9"):
        preset_config("grouped-query", d_model=72, n_heads=9)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "variants is empty"),
        (["wide", "wide"], "variants lists wide more than once"),
        (["wide", "bogus"], "unknown variant 'bogus'; known variants: wide"),
        (["bogus", "nope"], "unknown variants 'bogus', 'nope'; known variants: wide"),
    ],
)
def test_check_presets_names_the_values(names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_presets(names)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_heads=[]), "n_heads is empty"),
        (dict(n_heads=[2, 0]), "n_heads has 0"),
        (dict(n_heads=[2, "4"]), "n_heads has '4'"),
        (dict(n_heads=[2, 2]), "n_heads lists 2 more than once"),
        (dict(n_heads=[2], variants=[]), "variants is empty"),
        (dict(n_heads=[2], variants=["wide", "wide"]), "variants lists wide more than once"),
        (dict(n_heads=[2], variants=["wide", "bogus"]), "unknown variant 'bogus'; known variants: wide"),
        (dict(n_heads=[2], seq_len=0), "seq_len=0"),
    ],
)
def test_sweep_errors_name_the_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        sweep(d_model=16, **kwargs)
