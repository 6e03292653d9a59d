import gc
import json
import warnings
import weakref

import pytest
import torch

import headlab
from headlab.capture import CaptureBatch, Consumer, TruncationWarning, capture, tokenize_corpus
from headlab.heads import Heads
from headlab.models import headed
from tests.support.reference import model_reference
from tests.support.tiny import D_MODEL, HEADS


class Keep:
    """Keeps every batch's inputs and captured tensors (on purpose: for checking them)."""

    def __init__(self):
        self.batches = []

    def update(self, batch: CaptureBatch) -> None:
        self.batches.append(batch)


def run(model, tokenizer, texts, **kwargs):
    keep = Keep()
    kwargs.setdefault("progress", False)
    result = capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[keep], **kwargs)
    return result, keep.batches


def test_every_item_once_and_matches_the_layers_own_forward(model, tokenizer, texts):
    result, batches = run(model, tokenizer, texts, take=("pattern", "result", "z"), batch_tokens=40)
    assert result.batches == len(batches) == model.forward_calls and len(batches) > 2
    indices = torch.cat([b.corpus_indices for b in batches]).tolist()
    assert sorted(indices) == list(range(len(texts)))
    tc = tokenize_corpus(tokenizer, texts)
    assert result.tokens == tc.n_tokens == sum(int(b.lengths.sum()) for b in batches)
    assert result.padded_tokens == sum(b.input_ids.numel() for b in batches)
    for batch in batches:
        assert batch.input_ids.shape[1] == int(batch.lengths.max())  # padded to the batch's longest only
        for row, i in enumerate(batch.corpus_indices.tolist()):
            n = int(batch.lengths[row])
            assert batch.texts[row] == texts[i]
            assert batch.input_ids[row, :n].tolist() == tc.encodings[i].ids
            assert batch.attention_mask[row].tolist() == [1] * n + [0] * (batch.input_ids.shape[1] - n)
            expected = model_reference(model, tc.encodings[i].ids)
            for layer, taken in batch.layers.items():
                for name in ("pattern", "result", "z"):
                    got = getattr(taken, name)[row, :, :n]
                    if name == "pattern":
                        got = got[..., :n]
                        assert getattr(taken, name)[row, :, :n, n:].abs().sum() == 0  # no weight on padding
                    torch.testing.assert_close(got, expected[layer][name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("heads", "expected"),
    [
        (None, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1]}),
        (Heads(layers=[1], heads=[3, 0]), {1: [0, 3]}),
        (Heads(layers=[0, 2], heads=[1]), {0: [1], 2: [1]}),
        ({2: [0], 0: [2, 3]}, {0: [2, 3], 2: [0]}),
        ({1: None}, {1: [0, 1, 2, 3]}),
        ([(2, 1), (0, 3), (2, 0), (2, 1)], {0: [3], 2: [0, 1]}),
        (Heads(layers=[2], heads=torch.tensor([1])), {2: [1]}),
    ],
)
def test_consumers_receive_only_the_selected_heads(model, tokenizer, texts, heads, expected):
    result, batches = run(model, tokenizer, texts, heads=heads, take=("pattern", "z"))
    assert result.layers == expected
    for batch in batches:
        assert list(batch.layers) == list(expected)
        b, pos = batch.input_ids.shape
        for layer, taken in batch.layers.items():
            n = len(expected[layer])
            assert taken.heads == tuple(expected[layer])
            assert taken.pattern.shape == (b, n, pos, pos)
            assert taken.z.shape == (b, n, pos, D_MODEL // max(HEADS))  # pruning keeps the head size
            assert taken.result is None


def test_selected_heads_are_the_right_heads(model, tokenizer, texts):
    _, full = run(model, tokenizer, texts, batch_tokens=None, max_batch_size=100)
    _, one = run(model, tokenizer, texts, heads=Heads(layers=[1], heads=[2]), batch_tokens=None, max_batch_size=100)
    torch.testing.assert_close(one[0].layers[1].pattern[:, 0], full[0].layers[1].pattern[:, 2])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"heads": Heads(layers=[3])}, ValueError, r"layers has layer 3, which does not exist: expected layers 0..2"),
        ({"heads": {2: [2]}}, ValueError,
         r"the heads of layer 2 has head 2, which does not exist: expected heads 0..1"),
        ({"heads": Heads(layers=[])}, ValueError, "layers is empty: it selects no layer"),
        ({"heads": {}}, ValueError, "the head selection is empty"),
        ({"heads": Heads(heads=["a"])}, TypeError, "has 'a'; expected int head indices"),
        ({"heads": "0,1"}, TypeError, "a head selection is None, Heads"),
        ({"take": ("pattern", "scores")}, ValueError, "take="),
        ({"take": ()}, ValueError, "take="),
        ({"consumers": [object()]}, TypeError, r"no update\(batch\)"),
        ({"batch_tokens": 0}, ValueError, "batch_tokens=0"),
    ],
)
def test_bad_arguments(model, tokenizer, texts, kwargs, error, match):
    with pytest.raises(error, match=match):
        capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, progress=False, **kwargs)
    assert all(m.tap is None for m in headed(model).sites)


def test_truncation_is_reported_never_silent(model, tokenizer, texts):
    with pytest.warns(TruncationWarning, match=r"3 of 8 inputs are longer than max_length=8 pieces.*2, 5, 7"):
        result, batches = run(model, tokenizer, texts, max_length=8)
    full = tokenize_corpus(tokenizer, texts).lengths
    assert result.truncated == [i for i, n in enumerate(full) if n > 8] == [2, 5, 7]
    assert result.n_truncated == 3 and result.max_length == 8
    assert result.to_dict()["truncated"] == [2, 5, 7]
    for batch in batches:
        assert batch.input_ids.shape[1] <= 8
        assert batch.truncated.tolist() == [i in (2, 5, 7) for i in batch.corpus_indices.tolist()]


def test_default_max_length_is_the_models(model, tokenizer, texts):
    model.config.max_position_embeddings = 10
    with pytest.warns(TruncationWarning, match="max_length=10"):
        result, _ = run(model, tokenizer, texts)
    assert result.max_length == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to report, nothing said
        assert run(model, tokenizer, texts, max_length=64)[0].truncated == []


def test_taps_removed_after_a_capture_and_after_a_consumer_error(model, tokenizer, texts):
    modules = headed(model).sites
    run(model, tokenizer, texts)
    assert all(m.tap is None for m in modules)

    class Boom:
        def update(self, batch):
            assert all(m.tap is not None for m in modules)  # tapped while the capture runs
            raise RuntimeError("consumer failed")

    model.train()
    with pytest.raises(RuntimeError, match="consumer failed"):
        capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Boom()], progress=False)
    assert all(m.tap is None for m in modules)
    assert model.training  # the mode is restored too
    model.eval()
    model(torch.tensor([[2, 3]]), torch.tensor([[1, 1]]))  # the model runs untapped afterwards


def test_a_second_capture_on_a_tapped_model_is_refused(model, tokenizer, texts):
    modules = headed(model).sites

    class Nested:
        def update(self, batch):
            capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts[:1], progress=False)

    with pytest.raises(RuntimeError, match="already have a tap"):
        capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Nested()], progress=False)
    assert all(m.tap is None for m in modules)


def test_consumers_get_per_batch_data_only(model, tokenizer, texts):
    """Nothing of a batch is kept after its consumers return: memory does not grow with the corpus."""
    refs = []

    class Watch:
        def update(self, batch):
            gc.collect()
            assert all(r() is None for r in refs), "an earlier batch's tensors are still alive"
            refs.extend(weakref.ref(t) for t in (batch.layers[0].pattern, batch.layers[2].pattern, batch.input_ids))
            refs.append(weakref.ref(batch))

    result = capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Watch()], batch_tokens=30,
                     progress=False)
    assert result.batches > 2
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_patterns_a_consumer_keeps_are_never_overwritten_by_reused_memory(model, tokenizer, texts, monkeypatch):
    from headlab.models import interface

    made = []
    pooled = interface._pooled
    monkeypatch.setattr(interface, "_pooled", lambda pool, *args: made.append(len(pool)) or pooled(pool, *args))
    kept, copies = [], []

    class Keep:
        def update(self, batch):
            kept.extend([batch.layers[0].pattern, batch.layers[2].pattern[:, 1]])  # a whole pattern and a view
            copies.extend(t.clone() for t in kept[-2:])

    class Discard:
        def update(self, batch):
            pass

    result = capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Keep()], batch_tokens=30,
                     progress=False)
    assert result.batches > 2 and made
    assert all(torch.equal(a, b) for a, b in zip(kept, copies, strict=True))
    assert getattr(interface._pattern_memory, "pool", None) is None  # released after the capture
    made.clear()
    capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Discard()], batch_tokens=30,
            progress=False)
    assert max(made) < len(headed(model).sites) * result.batches  # what no one keeps is reused


def test_consumers_called_in_order_and_protocol(model, tokenizer, texts):
    calls = []

    class Named:
        def __init__(self, name):
            self.name = name

        def update(self, batch):
            calls.append((self.name, tuple(batch.corpus_indices.tolist())))

    a, b = Named("a"), Named("b")
    assert isinstance(a, Consumer)
    capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[a, b], batch_tokens=40, progress=False)
    assert [c[0] for c in calls] == ["a", "b"] * (len(calls) // 2)
    assert calls[0::2] == [("a", c[1]) for c in calls[1::2]]


def test_result_to_dict_is_json(model, tokenizer, texts, capsys):
    result = capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, heads=Heads(layers=[0]), progress=True)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["items"] == 8 and d["batches"] == result.batches and d["layers"] == {"0": [0, 1, 2, 3]}
    assert d["tokens_per_second"] > 0 and d["seconds"] > 0 and d["corpus"]["source"] == "list of 8 strings"
    assert d["take"] == ["pattern"] and d["truncated_items"] == 0


def test_inference_mode_and_no_graph(model, tokenizer, texts):
    seen = []

    class Check:
        def update(self, batch):
            t = batch.layers[0].pattern
            seen.append((t.requires_grad, t.is_inference(), torch.is_grad_enabled()))

    capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, consumers=[Check()], progress=False)
    assert seen and all(s == (False, True, False) for s in seen)


def test_the_old_keywords_still_work_for_a_release(model, tokenizer, texts):
    # capture(model, tokenizer, corpus, what=...) was the signature before the handle held the tokenizer.
    with pytest.warns(DeprecationWarning, match="is deprecated") as caught:
        result = capture(model, tokenizer, texts[:2], what=("z",), progress=False)
    said = " ".join(str(w.message) for w in caught)
    assert "capture(what=...) is deprecated: it is take=" in said and "capture(tokenizer=...) is deprecated" in said
    assert result.take == ("z",) and result.items == 2
    with pytest.warns(DeprecationWarning, match="CaptureResult.what is deprecated"):
        assert result.what == ("z",)
