"""Patching per position and per tensor (z, q, k, v, pattern), denoising and noising: each patch equal to the
same patch made by forward hooks on the model's own modules (float64, a tiny GPT-2 and a grouped-query LLaMA),
whole-sequence results unchanged, causality exact, AtP per position adding up to the whole estimate."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis.patching import activation_patching, attribution_patching, logit_difference
from headlab.models import headed
from tests.support.tiny import ARCHITECTURES, build

LENGTH, READ = 7, 4  # the metric reads the logits at position READ
CHANGED = [1, 3]  # the positions the corruption changes
METRIC = logit_difference(5, 7, position=READ)


def _pair(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(3, 100, (batch, LENGTH), generator=generator)
    corrupted = clean.clone()
    corrupted[:, CHANGED] = torch.randint(3, 100, (batch, len(CHANGED)), generator=generator)
    return clean, corrupted


def _attention64(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention as the paper writes it, every step in the inputs' dtype (transformers' eager LLaMA takes its
    softmax in float32): the reference's, registered with transformers without headlab."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = scores.softmax(dim=-1)  # (batch, head, query_pos, key_pos)
    return (weights @ value).transpose(1, 2).contiguous(), weights


@functools.cache
def _models(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The float64 reference (``_attention64``, no headlab) and an attached copy."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("reference64", _attention64)
    AttentionMaskInterface.register("reference64", eager_mask)
    reference = build(name, attn_implementation="reference64").double()
    return reference, headlab.attach(copy.deepcopy(reference)).model


# --- the reference: the same patch by forward hooks on the model's own projections --------------------------------

def _spot(model: torch.nn.Module, layer: int, take: str, head: int) -> tuple[torch.nn.Module, str, slice]:
    """Where a head's ``take`` is a slice of columns: ``(module, "input" | "output", columns)``.

    z is the output projection's input; q, k, v the q/k/v projections' outputs (GPT-2: one fused Conv1D).
    Rotary positions act position by position, so a q or k replaced before them is replaced after them too."""
    if model.config.model_type == "gpt2":
        attn, d = model.transformer.h[layer].attn, model.config.n_embd
        d_head = d // model.config.n_head
        if take == "z":
            return attn.c_proj, "input", slice(head * d_head, (head + 1) * d_head)
        start = "qkv".index(take) * d + head * d_head
        return attn.c_attn, "output", slice(start, start + d_head)
    attn = model.model.layers[layer].self_attn
    module = attn.o_proj if take == "z" else getattr(attn, f"{take}_proj")
    return module, "input" if take == "z" else "output", slice(head * attn.head_dim, (head + 1) * attn.head_dim)


def _forward(model, ids, spot, *, keep=None, put=None, positions=None, **kwargs):
    """One forward; ``keep`` collects the spot's columns, ``put`` ``(batch, pos, d)`` replaces them at ``positions``."""
    module, side, columns = spot

    def edit(x):
        if keep is not None:
            keep.append(x[..., columns].clone())
        if put is None:
            return x
        x = x.clone()
        x[:, positions, columns] = put[:, positions].to(x)
        return x

    if side == "input":
        handle = module.register_forward_pre_hook(lambda m, args: (edit(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda m, args, out: edit(out))
    try:
        with torch.no_grad():
            return model(input_ids=ids, **kwargs)
    finally:
        handle.remove()


def _reference_change(name, layer, take, head, positions, *, source, base) -> float:
    """metric(base with the unit's ``take`` from ``source`` at ``positions``) − metric(base), by hooks alone."""
    reference, _ = _models(name)
    if take == "pattern":  # z = the source's pattern @ the base run's v, at the patched query positions
        config = reference.config
        kv = head // (config.num_attention_heads // getattr(config, "num_key_value_heads", config.num_attention_heads))
        pattern = _forward(reference, source, _spot(reference, layer, "z", head),
                           output_attentions=True).attentions[layer][:, head]  # (batch, query_pos, key_pos)
        v = []
        _forward(reference, base, _spot(reference, layer, "v", kv), keep=v)
        values, spot = pattern @ v[0], _spot(reference, layer, "z", head)
    else:
        spot = _spot(reference, layer, take, head)
        kept = []
        _forward(reference, source, spot, keep=kept)
        values = kept[0]
    patched = _forward(reference, base, spot, put=values, positions=positions)
    return float(METRIC(patched) - METRIC(_forward(reference, base, spot)))


@pytest.mark.parametrize("take", ["z", "q", "k", "v", "pattern"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_each_position_equals_the_patch_made_by_hooks(name, take):
    _, model = _models(name)
    clean, corrupted = _pair()
    result = activation_patching(model, clean, corrupted, METRIC, positions="each", take=take)
    site = headed(model).sites[0]
    n_rows = site.n_kv_heads if take in ("k", "v") else site.n_heads  # k and v: one row per key/value head
    assert result.grid.heads == [(layer, h) for layer in (0, 1) for h in range(n_rows)]
    assert result.grid.effect.shape == (2 * n_rows, LENGTH) and result.forwards == 2 + 2 * n_rows * LENGTH
    expected = np.array([[_reference_change(name, layer, take, h, [p], source=clean, base=corrupted)
                          for p in range(LENGTH)] for layer, h in result.grid.heads])
    np.testing.assert_allclose(result.grid.change, expected, rtol=1e-9, atol=1e-12)
    gap = result.clean_metric - result.corrupted_metric
    np.testing.assert_allclose(result.grid.effect, expected / gap, rtol=1e-9, atol=1e-12)
    # the table: each row's cell of largest |effect|
    peak = np.abs(result.grid.effect).argmax(axis=1)
    np.testing.assert_array_equal(result.table["position"], peak)
    np.testing.assert_array_equal(result.table["effect"], result.grid.effect[np.arange(2 * n_rows), peak])


@pytest.mark.parametrize("take", ["z", "k", "pattern"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_noising_is_the_share_of_the_gap_lost(name, take):
    """The clean run receives the corrupted values; effect = (metric(clean) − metric(patched)) / (clean − corrupted)."""
    _, model = _models(name)
    clean, corrupted = _pair()
    result = activation_patching(model, clean, corrupted, METRIC, positions=[1, 3], take=take, direction="noise",
                                 heads={1: None})
    reference, _ = _models(name)
    with torch.no_grad():
        clean_metric, corrupted_metric = (float(METRIC(reference(input_ids=ids))) for ids in (clean, corrupted))
    assert result.clean_metric == pytest.approx(clean_metric, rel=1e-10)
    assert result.corrupted_metric == pytest.approx(corrupted_metric, rel=1e-10)
    changes = np.array([_reference_change(name, layer, take, h, [1, 3], source=corrupted, base=clean)
                        for layer, h in result.table.heads])
    np.testing.assert_allclose(result.table["change"], changes, rtol=1e-9, atol=1e-12)
    lost = (clean_metric - (clean_metric + changes)) / (clean_metric - corrupted_metric)
    np.testing.assert_allclose(result.table["effect"], lost, rtol=1e-8, atol=1e-12)
    assert (result.direction, result.positions, result.to_dict()["direction"]) == ("noise", [1, 3], "noise")


@pytest.mark.parametrize("take", ["z", "q", "k", "v"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_position_together_is_the_whole_sequence_patch(name, take):
    """positions=list(range(T)) takes the per-position path of the replacement; the numbers are the same bits."""
    _, model = _models(name)
    clean, corrupted = _pair()
    whole = activation_patching(model, clean, corrupted, METRIC, take=take)
    together = activation_patching(model, clean, corrupted, METRIC, take=take, positions=list(range(LENGTH)))
    np.testing.assert_array_equal(together.table["change"], whole.table["change"])
    assert whole.table.heads == together.table.heads and whole.positions is None and whole.grid is None


def test_whole_sequence_z_patching_is_the_scoped_patch_of_every_head():
    """The default (z, every position, denoising) is ``heads.patched`` head by head, as before positions."""
    from headlab.heads.scoped import patched

    _, model = _models("llama")
    clean, corrupted = _pair()
    result = activation_patching(model, clean, corrupted, METRIC)
    source = headlab.run_with_cache(model, clean, take="z")
    with torch.no_grad():
        base = float(METRIC(model(input_ids=corrupted)))
        for (layer, h), change in zip(result.table.heads, result.table["change"]):
            with patched(model, {layer: [h]}, source):
                assert float(METRIC(model(input_ids=corrupted))) - base == change


@pytest.mark.parametrize("take", ["z", "q", "k", "v", "pattern"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_positions_after_the_read_change_nothing_in_a_causal_model(name, take):
    model = headlab.attach(build(name)).model  # float32, as a model runs
    clean, corrupted = _pair()
    result = activation_patching(model, clean, corrupted, METRIC, positions="each", take=take)
    assert (result.grid.change[:, READ + 1:] == 0).all()
    assert (result.grid.change[:, : READ + 1] != 0).any()


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_per_position_is_exact_when_the_metric_is_linear_in_z(direction):
    """⟨w, the last layer's output projection⟩ is linear in its z: AtP equals activation patching per position."""
    _, model = _models("llama")
    last = headed(model).sites[-1]
    taken = {}
    hook = last.out_proj.module.register_forward_hook(lambda m, a, out: taken.__setitem__("out", out))
    w = torch.linspace(-1, 1, last.out_proj.module.out_features, dtype=torch.float64)

    def metric(output):
        return (taken["out"] @ w).sum()

    clean, corrupted = _pair()
    try:
        exact = activation_patching(model, clean, corrupted, metric, heads={last.layer: None}, positions="each",
                                    direction=direction)
        atp = attribution_patching(model, clean, corrupted, metric, heads={last.layer: None}, positions="each",
                                   direction=direction)
    finally:
        hook.remove()
    np.testing.assert_allclose(atp.grid.change, exact.grid.change, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(atp.grid.effect, exact.grid.effect, rtol=1e-9, atol=1e-12)
    assert (atp.forwards, atp.backwards) == (2, 1)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("take", ["z", "q", "k", "v"])
def test_attribution_per_position_adds_up_to_the_whole_estimate(take, direction):
    _, model = _models("llama")
    clean, corrupted = _pair()
    whole = attribution_patching(model, clean, corrupted, METRIC, take=take, direction=direction)
    each = attribution_patching(model, clean, corrupted, METRIC, take=take, direction=direction, positions="each")
    some = attribution_patching(model, clean, corrupted, METRIC, take=take, direction=direction, positions=[1, -3])
    assert each.grid.heads == whole.table.heads == some.table.heads
    np.testing.assert_allclose(each.grid.change.sum(axis=1), whole.table["change"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(each.grid.change[:, [1, LENGTH - 3]].sum(axis=1), some.table["change"], rtol=1e-12,
                               atol=1e-15)
    assert some.positions == [1, LENGTH - 3] and np.abs(whole.table["change"]).max() > 0


def test_grouped_heads_patch_k_and_v_once_per_key_value_head():
    """Query heads 0 and 1 read key/value head 0: selecting either patches it, listed once as (layer, kv head)."""
    _, model = _models("llama")
    clean, corrupted = _pair()
    one = activation_patching(model, clean, corrupted, METRIC, heads={1: [1]}, take="k")
    group = activation_patching(model, clean, corrupted, METRIC, heads={1: [0, 1, 3]}, take="k")
    assert one.table.heads == [(1, 0)] and group.table.heads == [(1, 0), (1, 1)]
    assert one.table.value("change", 1, 0) == group.table.value("change", 1, 0)
    assert one.to_dict()["unit"] == "kv_head" and "key/value heads" in repr(group)
    assert "L1 KV0" in repr(one)


def test_the_model_is_put_back():
    _, model = _models("llama")
    clean, corrupted = _pair()
    with torch.no_grad():
        before = model(input_ids=corrupted).logits
    for take in ("q", "k", "pattern"):
        activation_patching(model, clean, corrupted, METRIC, positions="each", take=take, heads={0: [1]})
    attribution_patching(model, clean, corrupted, METRIC, positions="each", take="v")
    assert all(site.idle for site in headed(model).sites)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=corrupted).logits, before, atol=0, rtol=0)


@pytest.mark.parametrize("options, message", [
    (dict(positions=[7]), r"position 7 is out of range: these inputs have 7 query positions; expected 0 to 6 "
                          r"\(or -7 to -1\)"),
    (dict(positions=[-8], take="k"), "position -8 is out of range: these inputs have 7 key positions"),
    (dict(positions="all"), r"positions='all'; expected None \(every position at once\), 'each'"),
    (dict(positions=[]), r"positions=\[\] patches nothing"),
    (dict(positions=[2, -5]), r"positions=\[2, -5\] lists position 2 more than once"),
    (dict(positions=[1.5]), r"positions=\[1.5\] has 1.5"),
    (dict(positions=[True]), r"has True"),
    (dict(take="o"), r"take='o'; expected one of 'z', 'q', 'k', 'v', 'pattern'"),
    (dict(direction="up"), r"direction='up'; expected 'denoise'"),
])
@pytest.mark.parametrize("method", [activation_patching, attribution_patching])
def test_bad_options_name_the_value_and_what_was_expected(method, options, message):
    _, model = _models("gpt2")
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match=message):
        method(model, clean, corrupted, METRIC, **options)


def test_other_refusals():
    _, model = _models("gpt2")
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match=r"same shape to patch between them: clean \(2, 7\), corrupted \(2, 5\)"):
        activation_patching(model, clean, corrupted[:, :5], METRIC, positions=[6])
    with pytest.raises(ValueError, match="take='pattern' has no attribution estimate"):
        attribution_patching(model, clean, corrupted, METRIC, take="pattern")
    with pytest.raises(ValueError, match="selects no head"):
        activation_patching(model, clean, corrupted, METRIC, heads={0: []})


def test_a_pattern_patch_keeps_the_heads_persistent_interventions():
    """A masked head's z is 0 whatever its pattern: patching the pattern changes nothing; its z patched does."""
    from headlab import heads

    model = headlab.attach(build("llama").double()).model
    clean, corrupted = _pair()
    with heads.masked(model, {1: [2]}):
        pattern = activation_patching(model, clean, corrupted, METRIC, heads={1: [2]}, take="pattern",
                                      positions="each")
        plain = activation_patching(model, clean, corrupted, METRIC, heads={1: [3]}, take="pattern")
    assert (pattern.grid.change == 0).all()
    with heads.scaled(model, {1: [3]}, 0.5):
        half = activation_patching(model, clean, corrupted, METRIC, heads={1: [3]}, take="pattern")
    assert half.table.value("change", 1, 3) != pytest.approx(plain.table.value("change", 1, 3), rel=1e-6)


def test_positions_may_be_a_tensor_or_an_array():
    _, model = _models("gpt2")
    clean, corrupted = _pair()
    listed = activation_patching(model, clean, corrupted, METRIC, heads={1: [0]}, positions=[2, 4])
    for positions in (torch.tensor([2, 4]), np.array([2, -3])):
        same = activation_patching(model, clean, corrupted, METRIC, heads={1: [0]}, positions=positions)
        assert same.positions == [2, 4] and same.table["change"][0] == listed.table["change"][0]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_patches_per_position(name):
    """Each architecture headlab serves: q and k per position, exactly and estimated, on a small input."""
    handle = headlab.attach(build(name))
    clean, corrupted = _pair(batch=1)
    causal = ARCHITECTURES[name].causal

    def metric(output):
        first = output.logits if causal else output.last_hidden_state
        return first[:, READ].square().mean()

    for take in ("q", "k"):
        exact = activation_patching(handle, clean, corrupted, metric, heads={1: None}, positions="each", take=take)
        estimate = attribution_patching(handle, clean, corrupted, metric, heads={1: None}, positions="each",
                                        take=take)
        assert exact.grid.effect.shape == estimate.grid.effect.shape == (len(exact.grid.heads), LENGTH)
        assert np.isfinite(exact.grid.change).all() and np.isfinite(estimate.grid.change).all()
        if causal:  # in the last layer, a query or key after the read position changes nothing there
            assert not exact.grid.change[:, READ + 1:].any()
