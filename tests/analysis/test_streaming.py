"""The streaming-head simulation: z and loss changes per head against one explicit run per head
(windowing a whole layer at once gives each head's own z change); sums merge; the conversion is
the cheapest tolerant heads, measured, within the budget; memory counts a key/value head only when
all its query heads stream (GQA), and attention-score entries for an encoder; bad settings are
one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlab
from headlab import heads
from headlab.analysis.importance import causal_lm_loss
from headlab.analysis.streaming import StreamingStats, _memory, corpus_batches, streaming_simulation
from headlab.capture import load_corpus, run_with_cache
from headlab.models import HeadedModel
from tests.support.tiny import tiny

pytest.importorskip("transformers")

WINDOWS = (2, 5)


def _batches(model, count=3, batch_size=2, length=16):
    return corpus_batches(model.tokenizer, load_corpus().texts, length=length, count=count, batch_size=batch_size)


def test_corpus_batches_are_full_chunks():
    batches = _batches(tiny("gpt2"))
    assert [b["input_ids"].shape for b in batches] == [(2, 16), (1, 16)]
    assert all(bool(b["attention_mask"].all()) for b in batches)
    with pytest.raises(ValueError, match=r"the corpus holds 1 chunks of 16 tokens; 3 were asked for"):
        corpus_batches(tiny("gpt2").tokenizer, ["the cat sat on the mat and the dog ran off to the big red mat"],
                       length=16, count=3)


def _lm_loss(model, batch):
    with torch.no_grad():
        return float(causal_lm_loss(model.model, batch))


def _pooled(model, batch):
    """Mean of the last hidden states over real tokens, unit length, in float64 (sentence-transformers' recipe)."""
    with torch.no_grad():
        hidden = model.model(**batch)
    hidden = getattr(hidden, "last_hidden_state", None)
    if hidden is None:
        return None
    weights = batch["attention_mask"].double()[..., None]
    return torch.nn.functional.normalize((hidden.double() * weights).sum(1) / weights.sum(1), dim=-1)


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_each_heads_changes_equal_a_run_with_that_head_alone(kind):
    model = tiny(kind)
    batch = _batches(model, count=2)[0]
    stats = StreamingStats(model, windows=WINDOWS, sinks=1)
    stats.measure(batch)
    z_change, loss_change, base, all_heads = stats.result()
    base_z = run_with_cache(model, batch, take=("z",))
    reference = _pooled(model, batch)
    for w, window in enumerate(WINDOWS):
        for i, (layer, head) in enumerate(stats.heads):
            with heads.windowed(model, [(layer, head)], window=window, sinks=1):
                z = run_with_cache(model, batch, take=("z",), heads={layer: [head]})["z", layer, head]
                if kind == "gpt2":
                    loss = _lm_loss(model, batch) - base
                else:
                    loss = float((1 - (_pooled(model, batch) * reference).sum(-1)).mean())
            z0 = base_z["z", layer, head]
            assert z_change[w, i] == pytest.approx(float((z - z0).norm() / z0.norm()), rel=1e-4)
            assert loss_change[w, i] == pytest.approx(loss, rel=1e-3, abs=1e-6)
        assert np.all(z_change[w] > 0)
    assert np.all(z_change[1] <= z_change[0] + 1e-6)  # the longer window changes each head less here
    assert base == (0.0 if kind == "bert" else pytest.approx(_lm_loss(model, batch), rel=1e-6))
    assert all_heads.shape == (2,)


def test_sums_merge_across_batches():
    model = tiny("gpt2")
    batches = _batches(model, count=4)
    whole, first, second = (StreamingStats(model, windows=WINDOWS, sinks=2) for _ in range(3))
    for b in batches:
        whole.measure(b)
    first.measure(batches[0])
    second.measure(batches[1])
    merged = first.merge(second)
    for a, b in zip(merged.result(), whole.result()):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    with pytest.raises(ValueError, match=r"cannot merge streaming sums of heads \[4, 4\], windows \[2\]"):
        whole.merge(StreamingStats(model, windows=[2], sinks=2))


@pytest.fixture(scope="module")
def causal_result():
    return streaming_simulation(tiny("gpt2"), windows=WINDOWS, sinks=1, budget=0.002, length=16, texts=4)


def test_the_conversion_is_measured_and_within_budget(causal_result):
    model, result = tiny("gpt2"), causal_result
    batches = _batches(model, count=4, batch_size=8)
    base = _lm_loss(model, batches[0])
    for c in result.conversions:
        losses = result.table[f"loss_change_w{c.window}"]
        expected = [result.table.heads[i] for i in np.argsort(losses, kind="stable") if losses[i] <= result.budget]
        assert c.tolerant == expected and c.heads == expected[:len(c.heads)]
        assert c.loss_change <= result.budget
        with heads.windowed(model, c.heads, window=c.window, sinks=1):
            measured = _lm_loss(model, batches[0]) - base
        assert c.loss_change == pytest.approx(measured, abs=5e-6)  # float32 loss vs float64 sum
        if len(c.heads) < len(c.tolerant):  # one more tolerant head breaks the budget
            with heads.windowed(model, c.tolerant[:len(c.heads) + 1], window=c.window, sinks=1):
                assert _lm_loss(model, batches[0]) - base > result.budget
        assert result.table[f"streaming_w{c.window}"].sum() == len(c.heads)
    assert result.kind == "causal" and result.memory == "key/value cache" and result.length == 16
    document = result.to_dict()
    assert document["conversions"][0]["window"] == WINDOWS[0] and len(document["rows"]) == 8


def test_a_budget_below_the_combined_cost_cuts_the_conversion():
    model = tiny("bert")
    loose = streaming_simulation(model, windows=(2,), sinks=0, budget=1.0, length=16, texts=2)
    single = loose.table["loss_change_w2"]
    assert single.max() < loose.all_heads[0]  # every head tolerable alone, not all together
    result = streaming_simulation(model, windows=(2,), sinks=0, budget=float(single.max()), length=16, texts=2)
    c = result.conversions[0]
    assert result.kind == "bidirectional" and result.memory == "attention scores" and result.base_loss == 0.0
    assert len(c.tolerant) == 8 and len(c.heads) < 8 and c.evaluations >= 2
    batch = _batches(model, count=2, batch_size=8)[0]
    reference = _pooled(model, batch)
    for k, within in ((len(c.heads), True), (len(c.heads) + 1, False)):
        with heads.windowed(model, c.tolerant[:k], window=2, sinks=0):
            loss = float((1 - (_pooled(model, batch) * reference).sum(-1)).mean())
        assert (loss <= result.budget) == within
        if within:
            assert c.loss_change == pytest.approx(loss, rel=1e-4)  # float32 pooling inside


def test_gqa_frees_a_key_value_head_only_when_all_its_query_heads_stream():
    from tests.support.tiny import build

    net = headlab.attach(build("llama", num_key_value_heads=2, attn_implementation="sdpa")).model  # 4 heads, 2 per kv
    stats = StreamingStats(HeadedModel(net, source="tiny llama"), windows=[3], sinks=1)
    width = 8 + 8  # d_head + d_head_v numbers per cached token
    assert _memory(stats, [(0, 0)], 3, 20) == (0, 1, 4, 0, 4 * 20 * width * 4, 0.0)
    freed, unsaved, units, saved, total, limit = _memory(stats, [(0, 0), (0, 1), (1, 3)], 3, 20)
    assert (freed, unsaved, units, saved, total, limit) == (1, 1, 4, (20 - 4) * width * 4, 4 * 20 * width * 4, 0.25)


def test_an_encoders_memory_is_attention_scores():
    stats = StreamingStats(tiny("bert"), windows=[2], sinks=1)
    allowed = 10 * 10 - sum(1 for i in range(10) for j in range(10) if not (j < 1 or abs(i - j) <= 2))
    freed, unsaved, units, saved, total, limit = _memory(stats, [(1, 0)], 2, 10)
    assert (freed, unsaved, units, limit) == (1, 0, 8, 1 / 8)
    assert saved == (100 - allowed) * 4 and total == 8 * 100 * 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(windows=[]), r"windows=\[\]: expected a non-empty list of ints >= 1"),
    (dict(windows=[4, 0]), r"windows=\[4, 0\]: expected a non-empty list of ints >= 1"),
    (dict(sinks=-2), r"sinks=-2: expected an int >= 0"),
    (dict(budget=-0.1), r"budget=-0.1: expected a number >= 0"),
    (dict(length=5000), r"length=5000: tiny random gpt2 takes at most 2100 tokens"),
    (dict(texts=0), r"count=0: expected an int >= 1"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        streaming_simulation(tiny("gpt2"), **kwargs)


def test_dtype_of_the_memory_follows_the_model():
    stats = StreamingStats(tiny("gpt2"), windows=[2], sinks=0)
    assert _memory(stats, [], 2, 8)[4] == 8 * 8 * (8 + 8) * torch.finfo(torch.float32).bits // 8
