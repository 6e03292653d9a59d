"""``heads.windowed``: a streaming head's z equals an explicit float64 attention under the sink +
window mask, the model's own padding and causality kept; every other head is unchanged; every
path (fused, tapped patterns, output_attentions, GQA) reads the same mask; the block restores
the model exactly, on error too; bad windows are one-line errors."""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab import heads
from headlab.layer.masks import sink_window_blocked
from headlab.models import headed
from tests.support.tiny import ARCHITECTURES, batch, built, first_output

LAYER, HEAD = 1, 2


def _model(name: str):
    return headlab.attach(built(name, attn_implementation="sdpa").double()).model


def _reference_z(q, k, v, keep, *, scaling):
    """softmax(q kᵀ · scaling, dropped keys removed) v, one head: q ``(batch, pos, d)``, keep ``(batch, pos, pos)``."""
    scores = torch.einsum("bqd,bkd->bqk", q, k) * scaling
    scores = scores.masked_fill(~keep, float("-inf"))
    pattern = scores.softmax(-1).nan_to_num(0.0)
    return pattern @ v


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("window, sinks", [(3, 1), (2, 0), (1, 2)])
def test_a_windowed_head_is_the_explicit_masked_attention_and_others_are_unchanged(name, window, sinks):
    model = _model(name)
    site = headed(model).sites[LAYER]
    ids, mask = batch(padding="right", length=9)
    inputs = {"input_ids": ids, "attention_mask": mask}
    base = headlab.run_with_cache(model, inputs, take=("q", "k", "v", "z"), heads={LAYER: None})
    with heads.windowed(model, {LAYER: [HEAD]}, window=window, sinks=sinks):
        assert site.windows and not site.idle
        inside = headlab.run_with_cache(model, inputs, take=("z",), heads={LAYER: None})
    q, k, v = (base[n, LAYER, HEAD] for n in ("q", "k", "v"))  # (batch, pos, d)
    pos = ids.shape[1]
    real = mask.bool()
    keep = real[:, None, :].expand(-1, pos, -1).clone()  # padding keys dropped, as the model does
    if site.causal:
        keep &= torch.ones(pos, pos, dtype=torch.bool).tril()
        window_keep = (torch.arange(pos)[:, None] - torch.arange(pos)[None, :]) < window
    else:
        window_keep = (torch.arange(pos)[:, None] - torch.arange(pos)[None, :]).abs() <= window
    window_keep |= torch.arange(pos)[None, :] < sinks
    keep &= window_keep
    expected = _reference_z(q, k, v, keep, scaling=site.d_head ** -0.5)
    got = inside["z", LAYER, HEAD]
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[real], expected[real], rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got[real], base["z", LAYER, HEAD][real])  # the window changed something
    for h in range(site.n_heads):
        if h != HEAD:
            torch.testing.assert_close(inside["z", LAYER, h], base["z", LAYER, h], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_every_path_reads_the_window_and_the_block_restores_the_model(name):
    model = _model(name)
    ids, mask = batch(padding="right", length=9)
    with torch.no_grad():
        before = first_output(model(input_ids=ids, attention_mask=mask))
    with heads.windowed(model, {0: [0, 3], 1: [1]}, window=2, sinks=1):
        with torch.no_grad():
            fused = first_output(model(input_ids=ids, attention_mask=mask))
            eager = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        tapped = headlab.run_with_cache(model, {"input_ids": ids, "attention_mask": mask}, take=("pattern",),
                                        heads={0: [0, 3]})
        pattern = eager.attentions[0][:, 0]  # (batch, query_pos, key_pos)
        dropped = sink_window_blocked(9, 9, window=2, sinks=1, causal=headed(model).sites[0].causal, offset=0)
        assert float(pattern[:, dropped].abs().max()) == 0.0
        torch.testing.assert_close(tapped["pattern", 0, 0], pattern, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(first_output(eager), fused, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(fused, before)
    assert all(site.windows == () and site.idle for site in headed(model).sites)
    with torch.no_grad():
        assert torch.equal(first_output(model(input_ids=ids, attention_mask=mask)), before)
    with pytest.raises(RuntimeError, match="boom"), heads.windowed(model, {0: [1]}, window=2):
        raise RuntimeError("boom")
    assert all(site.windows == () for site in headed(model).sites)


def test_nested_windows_keep_what_both_keep():
    model = _model("gpt2")
    ids, mask = batch(padding="none", length=9)
    inputs = {"input_ids": ids, "attention_mask": mask}
    with heads.windowed(model, {0: [1]}, window=4, sinks=0), heads.windowed(model, {0: [1]}, window=6, sinks=2):
        both = headlab.run_with_cache(model, inputs, take=("pattern",), heads={0: [1]})["pattern", 0, 1]
        assert len(headed(model).sites[0].windows) == 2
    with heads.windowed(model, {0: [1]}, window=4, sinks=0):
        inner = headlab.run_with_cache(model, inputs, take=("pattern",), heads={0: [1]})["pattern", 0, 1]
    torch.testing.assert_close(both, inner, rtol=0, atol=1e-12)  # 4 recent keys ⊂ 6 recent or the first 2


def test_the_long_window_changes_nothing():
    model = _model("llama")
    ids, mask = batch(padding="right", length=9)
    with torch.no_grad():
        before = first_output(model(input_ids=ids, attention_mask=mask))
        with heads.windowed(model, None, window=9, sinks=0):
            after = first_output(model(input_ids=ids, attention_mask=mask))
    torch.testing.assert_close(after, before, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(window=0), ValueError, r"window=0: expected an int >= 1"),
    (dict(window=2.5), TypeError, r"window=2.5: expected an int >= 1"),
    (dict(window=True), TypeError, r"window=True: expected an int >= 1"),
    (dict(window=4, sinks=-1), ValueError, r"sinks=-1: expected an int >= 0"),
])
def test_bad_windows_are_refused(kwargs, error, message):
    model = _model("gpt2")
    with pytest.raises(error, match=message), heads.windowed(model, {0: [0]}, **kwargs):
        pass
    with pytest.raises(ValueError, match="layer"), heads.windowed(model, {7: [0]}, window=2):
        pass
    assert all(site.windows == () for site in headed(model).sites)


def test_the_mask_function_against_its_definition():
    causal = sink_window_blocked(3, 6, window=2, sinks=1, causal=True, offset=3)  # queries at 3, 4, 5
    assert (~causal).int().tolist() == [[1, 0, 1, 1, 1, 1], [1, 0, 0, 1, 1, 1], [1, 0, 0, 0, 1, 1]]
    both = sink_window_blocked(4, 4, window=1, sinks=0, causal=False, offset=0)
    assert (~both).int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_drops_the_keys_on_every_path(name):
    """Sliding windows, soft-capping, grouped and multi-query heads, fused projections: the window reaches
    the fused kernel and the eager patterns alike, and only the windowed heads change."""
    model = headlab.attach(built(name).double()).model  # built eager (Gemma 2 has no SDPA); attached, headlab's
    ids, mask = batch(padding="right", length=9)
    site = headed(model).sites[0]
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        with heads.windowed(model, {0: [1]}, window=2, sinks=1):
            fused = first_output(model(input_ids=ids, attention_mask=mask))
            eager = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    torch.testing.assert_close(first_output(eager)[real], fused[real], rtol=1e-9, atol=1e-9)
    dropped = sink_window_blocked(9, 9, window=2, sinks=1, causal=site.causal, offset=0)
    windowed_pattern, old = eager.attentions[0], before.attentions[0]
    on_real_queries = windowed_pattern[:, 1] * real[:, :, None]  # a padding query's row is the model's business
    assert float(on_real_queries[:, dropped].abs().max()) == 0.0
    others = [h for h in range(site.n_heads) if h != 1]
    torch.testing.assert_close(windowed_pattern[:, others], old[:, others], rtol=0, atol=1e-12)
