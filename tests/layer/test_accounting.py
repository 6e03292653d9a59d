"""Accounting: read off the built module, equal to the hand-derived counts it replaced.

``account`` builds the layer on the meta device and counts parameters by numel and FLOPs with
torch's FlopCounterMode, stage by stage. Three independent checks hold it:
- ``data/accounting_by_formula.json`` records what the per-variant formulas (the
  ``parameter_shapes`` / ``projection_flops`` methods the derivation replaced) gave for every
  config below at L = 1, 6 and 128: the derived numbers equal them exactly, stage by stage;
- parameter names and counts equal ``named_parameters()`` of the layer built for real;
- the stages add up to FlopCounterMode's count of one whole forward of the real layer (plus
  collaborative's element-wise mixing, which the accounting charges 1 FLOP per product and the
  counter's default table does not count).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import Accounting, account
from headlab.layer.presets import PRESETS, preset_config

FORMULA_RECORD = Path(__file__).parent / "data" / "accounting_by_formula.json"

PRESET_CASES = [(name, h) for name in PRESETS for h in (1, 2, 4, 8)]

CONFIGS = {
    "wide cross-attention": dict(d_model=16, n_heads=4, kdim=12, vdim=9),
    "wide no bias": dict(d_model=24, n_heads=3, bias=False),
    "wide d_head independent": dict(d_model=20, n_heads=3, d_head=7),
    "wide d_head_v": dict(d_model=16, n_heads=4, d_head=6, d_head_v=5),
    "grouped-query": dict(d_model=32, n_heads=8, n_kv_heads=2),
    "grouped-query cross, d_head_v": dict(d_model=32, n_heads=8, n_kv_heads=4, kdim=12, vdim=20, d_head_v=3),
    "multi-query rotary": dict(d_model=32, n_heads=4, n_kv_heads=1, rotary=True),
    "rotary partial": dict(d_model=48, n_heads=6, n_kv_heads=3, rotary=True, rotary_dim=4),
    "talking heads, no bias": dict(d_model=16, n_heads=4, talking_heads=True, bias=False),
    "talking heads GQA": dict(d_model=32, n_heads=8, n_kv_heads=2, talking_heads=True),
    "narrow cross-attention": dict(d_model=16, n_heads=4, kdim=12, vdim=8, projection="narrow"),
    "narrow d_head independent": dict(d_model=12, n_heads=3, d_head=5, d_head_v=2, projection="narrow", bias=False),
    "shared cross-attention": dict(d_model=16, n_heads=4, kdim=12, vdim=8, projection="shared"),
    "shared rotary, talking": dict(d_model=16, n_heads=2, projection="shared", rotary=True, talking_heads=True),
    "bilinear cross-attention": dict(d_model=16, n_heads=4, kdim=12, vdim=9, projection="bilinear"),
    "bilinear no bias, d_head_v": dict(d_model=16, n_heads=2, d_head_v=3, projection="bilinear", bias=False),
    "collaborative cross-attention": dict(d_model=16, n_heads=4, kdim=12, vdim=9, projection="collaborative"),
    "collaborative D<d_model, rotary": dict(d_model=16, n_heads=4, d_head=6, projection="collaborative", rotary=True),
    "collaborative talking heads": dict(d_model=16, n_heads=4, projection="collaborative", talking_heads=True),
    "collaborative D=d_model": dict(d_model=32, n_heads=4, d_head=32, d_head_v=8, projection="collaborative"),
    "wide bias_kv zero_attn": dict(d_model=16, n_heads=4, add_bias_kv=True, add_zero_attn=True),
    "grouped-query cross, bias_kv": dict(d_model=32, n_heads=8, n_kv_heads=2, kdim=12, vdim=20, add_bias_kv=True),
    "bilinear zero_attn, talking": dict(d_model=16, n_heads=2, projection="bilinear", add_zero_attn=True,
                                        talking_heads=True),
    "collaborative bias_kv": dict(d_model=16, n_heads=4, projection="collaborative", add_bias_kv=True),
}

ALL_CONFIGS = [pytest.param(preset_config(n, d_model=32, n_heads=h), id=f"{n}-{h}") for n, h in PRESET_CASES] + [
    pytest.param(AttentionConfig(**opts), id=name) for name, opts in CONFIGS.items()
]


def numels(config: AttentionConfig) -> dict[str, int]:
    return {name: p.numel() for name, p in MultiHeadAttention(config).named_parameters()}


# --- the derivation reproduces the formulas it replaced ---------------------------------------------

def _recorded() -> list[dict]:
    return json.loads(FORMULA_RECORD.read_text(encoding="utf-8"))


@pytest.mark.parametrize("entry", _recorded(), ids=lambda e: f"{e['id']}-L{e['seq_len']}")
def test_derived_counts_equal_the_per_variant_formulas(entry: dict) -> None:
    config = AttentionConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry["config"].items()})
    acc = account(config, seq_len=entry["seq_len"])
    assert acc.parameters == entry["parameters"]
    assert list(acc.flops.items()) == list(entry["flops"].items())  # same stages, same order, same numbers
    assert acc.qk_rank_bound == entry["qk_rank_bound"]


def test_the_formula_record_covers_every_variant_and_option() -> None:
    configs = [e["config"] for e in _recorded()]
    assert {c["projection"] for c in configs} == {"wide", "narrow", "shared", "bilinear", "collaborative"}
    for option in ("talking_heads", "rotary"):
        assert any(c[option] for c in configs)
    assert any(c["n_kv_heads"] == 1 for c in configs) and any(1 < c["n_kv_heads"] < c["n_heads"] for c in configs)
    assert any(c["kdim"] != c["d_model"] for c in configs) and any(not c["bias"] for c in configs)
    assert {e["seq_len"] for e in _recorded()} == {1, 6, 128}


def test_nothing_is_allocated() -> None:
    # 8·2^30 parameters (32 GiB in float32) are counted in a moment: the layer is built on the meta device.
    big = AttentionConfig(d_model=2**15, n_heads=64)
    start = time.perf_counter()
    acc = account(big, seq_len=4096)
    assert acc.total_parameters == 4 * 2**30 + 4 * 2**15
    assert time.perf_counter() - start < 5


# --- parameters --------------------------------------------------------------------------------

@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_parameters_are_exactly_the_modules(config: AttentionConfig) -> None:
    acc = account(config)
    expected = numels(config)
    assert acc.parameters == expected
    assert acc.total_parameters == sum(expected.values())
    assert acc.parameters_per_head == acc.total_parameters / config.n_heads


@pytest.mark.parametrize(("add_bias_kv", "add_zero_attn"), [(True, False), (False, True), (True, True)])
def test_extra_positions_count_as_in_torch(add_bias_kv: bool, add_zero_attn: bool) -> None:
    config = AttentionConfig(d_model=16, n_heads=4, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    acc = account(config, seq_len=5)
    mha = torch.nn.MultiheadAttention(16, 4, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    assert acc.total_parameters == sum(p.numel() for p in mha.parameters())
    assert ("extra_kv.bias_k" in acc.parameters) == add_bias_kv
    plain = account(AttentionConfig(d_model=16, n_heads=4), seq_len=5).flops
    assert acc.flops["scores"] == plain["scores"] * (5 + add_bias_kv + add_zero_attn) // 5  # one more key each
    assert acc.flops["q, k, v projections"] == plain["q, k, v projections"]


def test_wide_total_is_constant_in_heads() -> None:
    totals = {h: account(preset_config("wide", d_model=64, n_heads=h)).total_parameters for h in (1, 2, 4, 8, 16)}
    assert set(totals.values()) == {4 * 64 * 64 + 4 * 64}, totals
    assert totals[1] == sum(p.numel() for p in torch.nn.MultiheadAttention(64, 1).parameters())


def test_shared_projections_shrink_as_one_over_heads_squared() -> None:
    d = 64
    totals = []
    for h in (1, 2, 4, 8, 16):
        acc = account(preset_config("shared", d_model=d, n_heads=h))
        for role in ("q", "k", "v"):
            assert acc.parameters[f"projection.{role}_weight"] * h * h == d * d, (role, h)
        assert acc.parameters["projection.out_proj.weight"] == d * d  # the output projection does not shrink
        totals.append(acc.total_parameters)
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == len(totals)


def test_narrow_projections_shrink_as_one_over_heads() -> None:
    for h in (1, 2, 4, 8):
        acc = account(preset_config("narrow", d_model=64, n_heads=h))
        assert acc.parameters["projection.q_weight"] * h == 64 * 64


@pytest.mark.parametrize("kdim", [None, 12])
def test_bilinear_query_key_part_is_heads_times_d_model_times_kdim(kdim: int | None) -> None:
    for h in (1, 2, 4):
        config = AttentionConfig(d_model=16, n_heads=h, kdim=kdim, projection="bilinear")
        acc = account(config)
        assert acc.parameters["projection.qk_weight"] == h * 16 * (kdim or 16)
        assert acc.qk_rank_bound == min(16, kdim or 16)


# --- FLOPs ----------------------------------------------------------------------------------------

def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("seq_len", [1, 6])
@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_stages_add_up_to_the_counted_forward(config: AttentionConfig, seq_len: int) -> None:
    c, L = config, seq_len
    layer = MultiHeadAttention(c)
    query = torch.randn(1, L, c.d_model)
    cross = c.kdim != c.d_model or c.vdim != c.d_model
    key, value = (torch.randn(1, L, c.kdim), torch.randn(1, L, c.vdim)) if cross else (None, None)
    acc = account(c, seq_len=L)
    mixing = L * c.n_heads * c.d_head if c.projection == "collaborative" else 0  # q̃ ⊙ m_h: element-wise
    with torch.no_grad():
        explicit = _counted(lambda: layer(query, key, value, return_pattern=True))
    assert explicit == acc.total_flops - mixing
    extra = c.add_bias_kv + c.add_zero_attn
    assert acc.flops["scores"] == 2 * c.n_heads * L * (L + extra) * (c.kdim if c.projection == "bilinear" else c.d_head)
    assert acc.flops["weighted sum"] == 2 * c.n_heads * L * (L + extra) * c.d_head_v
    assert ("talking-heads mixing" in acc.flops) == c.talking_heads


def test_flop_stages_and_their_formulas() -> None:
    c = AttentionConfig(d_model=32, n_heads=4, d_head=6, d_head_v=5, talking_heads=True)
    acc = account(c, seq_len=10)
    assert list(acc.flops) == ["q, k, v projections", "scores", "talking-heads mixing", "weighted sum",
                               "output projection"]
    assert acc.flops["scores"] == 2 * 4 * 10 * 10 * 6
    assert acc.flops["weighted sum"] == 2 * 4 * 10 * 10 * 5
    assert acc.flops["output projection"] == 2 * 10 * 4 * 5 * 32
    assert acc.total_flops == sum(acc.flops.values())


def test_wide_flops_are_constant_in_heads_and_scores_grow_quadratically_in_length() -> None:
    flops = {account(preset_config("wide", d_model=64, n_heads=h), seq_len=32).total_flops for h in (1, 2, 4, 8)}
    assert len(flops) == 1
    short = account(preset_config("wide", d_model=64, n_heads=4), seq_len=8).flops
    long = account(preset_config("wide", d_model=64, n_heads=4), seq_len=16).flops
    assert long["scores"] == 4 * short["scores"] and long["q, k, v projections"] == 2 * short["q, k, v projections"]


# --- results, explanations, sweeps -------------------------------------------------------------------

def test_to_dict_is_json_ready_and_totals_are_not_constructor_arguments() -> None:
    acc = account(preset_config("talking-heads", d_model=16, n_heads=4), seq_len=3)
    d = json.loads(json.dumps(acc.to_dict()))
    assert d["config"]["talking_heads"] is True and d["seq_len"] == 3
    assert d["total_parameters"] == sum(d["parameters"].values()) == acc.total_parameters
    assert d["total_flops"] == sum(d["flops"].values())
    with pytest.raises(TypeError):
        Accounting(config=acc.config, seq_len=3, parameters={}, flops={}, qk_rank_bound=1, total_parameters=5)


# --- errors name the values ---------------------------------------------------------------------

@pytest.mark.parametrize("seq_len", [0, -3, 2.0, True, "8", None])
def test_bad_seq_len_is_named(seq_len) -> None:
    with pytest.raises(ValueError, match=re.escape(f"seq_len={seq_len!r}")):
        account(AttentionConfig(d_model=8, n_heads=2), seq_len=seq_len)


def test_account_needs_a_config() -> None:
    with pytest.raises(TypeError, match="AttentionConfig, got dict"):
        account({"d_model": 8, "n_heads": 2})


def test_account_refuses_what_the_variant_cannot_build() -> None:
    with pytest.raises(ValueError, match="n_heads=4 must divide d_model=18"):
        account(AttentionConfig(d_model=18, n_heads=4, d_head=4, projection="narrow"))


def test_a_layer_too_large_for_torch_is_a_value_error_naming_the_sizes() -> None:
    with pytest.raises(ValueError, match=r"d_model=1000000000, n_heads=1, .* too large for torch to describe"):
        account(AttentionConfig(d_model=10**9, n_heads=1))
