"""The streaming simulation of a head selection: each selected head's z and loss changes equal its row of
the every-head run exactly, the every-selected-head change equals a hand-run ``windowed`` loss, only the
selected heads are windowed and the forwards scale with the selection; different selections do not
merge."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlab.analysis.streaming as streaming
from headlab import heads
from headlab.analysis.importance import causal_lm_loss
from headlab.analysis.streaming import StreamingStats, corpus_batches, streaming_simulation
from headlab.capture import load_corpus
from tests.support.tiny import tiny

pytest.importorskip("transformers")

WINDOWS = (2, 5)
SELECTION = {1: [0, 1]}


def _batch(model):
    return corpus_batches(model.tokenizer, load_corpus().texts, length=16, count=2)[0]


def _pooled(model, batch):
    """Mean of the last hidden states over real tokens, unit length, in float64 (sentence-transformers' recipe)."""
    with torch.no_grad():
        hidden = model.model(**batch).last_hidden_state.double()
    weights = batch["attention_mask"].double()[..., None]
    return torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)


def _hand_loss(model, batch, reference):
    """The model's loss as it runs now: mean next-token cross-entropy (``reference`` None), or mean 1 − cos of
    its embeddings to ``reference``."""
    if reference is None:
        with torch.no_grad():
            return float(causal_lm_loss(model.model, batch))
    return float((1 - (_pooled(model, batch) * reference).sum(-1)).mean())


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_a_selections_changes_are_the_same_heads_rows_of_the_every_head_run(kind):
    model = tiny(kind)
    batch = _batch(model)
    every, part = StreamingStats(model, windows=WINDOWS, sinks=1), StreamingStats(model, windows=WINDOWS, sinks=1,
                                                                                   heads=SELECTION)
    every.measure(batch)
    part.measure(batch)
    assert part.heads == [(1, 0), (1, 1)] and len(every.heads) == 8
    rows = [every.heads.index(h) for h in part.heads]
    (z_all, loss_all, base_all, _), (z, loss, base, all_heads) = every.result(), part.result()
    np.testing.assert_array_equal(z, z_all[:, rows])
    np.testing.assert_array_equal(loss, loss_all[:, rows])
    assert base == base_all and np.all(z > 0)
    reference = None if kind == "llama" else _pooled(model, batch)
    base_hand = 0.0 if reference is not None else _hand_loss(model, batch, None)
    for w, window in enumerate(WINDOWS):  # every selected head streaming: a run of the selection, by hand
        with heads.windowed(model, SELECTION, window=window, sinks=1):
            assert all_heads[w] == pytest.approx(_hand_loss(model, batch, reference) - base_hand, rel=1e-4,
                                                    abs=1e-6)


def test_only_the_selected_heads_are_windowed_and_the_forwards_scale_with_the_selection(monkeypatch):
    model = tiny("llama")
    batch = _batch(model)
    windowed, seen = heads.windowed, []

    def spy(handle, selection, **kwargs):
        seen.append({h for layer, hs in handle.heads(selection).items() for h in ((layer, x) for x in hs)})
        return windowed(handle, selection, **kwargs)

    monkeypatch.setattr(streaming, "windowed", spy)
    forwards = []
    hook = model.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        for selection, n_layers, selected in ((SELECTION, 1, {(1, 0), (1, 1)}),
                                              (None, 2, {(layer, h) for layer in (0, 1) for h in range(4)})):
            seen.clear()
            forwards.clear()
            StreamingStats(model, windows=WINDOWS, sinks=1, heads=selection).measure(batch)
            # per window: one windowed forward per selected layer, one per selected head, one with all of them
            assert len(seen) == len(WINDOWS) * (n_layers + len(selected) + 1) and set().union(*seen) == selected
            assert len(forwards) == 2 + len(seen)  # and two unrestricted forwards (loss, z)
        seen.clear()
        result = streaming_simulation(model, heads=SELECTION, windows=WINDOWS, sinks=1, length=16, texts=2)
    finally:
        hook.remove()
    assert set().union(*seen) == {(1, 0), (1, 1)}
    assert result.table.heads == [(1, 0), (1, 1)]
    assert all(set(c.tolerant) <= {(1, 0), (1, 1)} for c in result.conversions)


def test_sums_of_different_selections_do_not_merge():
    model = tiny("bert")
    with pytest.raises(ValueError, match=r"^cannot merge streaming sums of the heads \{1: \[0, 1\]\} into sums of the "
                                         r"heads \{0: \[0, 1, 2, 3\], 1: \[0, 1, 2, 3\]\}: the selections differ$"):
        StreamingStats(model, windows=[2]).merge(StreamingStats(model, windows=[2], heads=SELECTION))
