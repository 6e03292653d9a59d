"""A corpus of (source, target) pairs for an encoder-decoder: the pairs file, and a capture whose batches carry both
sides, each layer reading its own (encoder: source × source, decoder: target × target, cross: target × source).

Held to transformers: every captured pattern of a padded batch of pairs of different lengths on both sides equals
the eager model's ``output_attentions`` for the item run alone (tiny random BART, Marian and T5 with MiniLM's
tokenizer).
"""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab.capture import capture, load_corpus
from headlab.capture.batch import SOURCE, TARGET, CaptureBatch
from tests.support.families import FAMILIES
from tests.support.minilm import minilm_tokenizer

PAIRS = [("The cat sat on the mat.", "Le chat était assis."),
         ("Heads attend.", "Les têtes regardent les mots de la phrase, un par un."),
         ("A dog ran home, fast, before the rain came down on the town.", "Un chien."),
         ("Short.", "Court.")]


def _model(name: str, tokenizer, implementation: str = "sdpa") -> torch.nn.Module:
    return FAMILIES[name].build(implementation, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                decoder_start_token_id=tokenizer.cls_token_id)


class Kept:
    """Each item's patterns per layer, cut to its real lengths, and the batches' views."""

    def __init__(self) -> None:
        self.patterns: dict[int, dict[int, torch.Tensor]] = {}
        self.views: list[list[tuple[tuple[int, ...], bool]]] = []

    def update(self, batch: CaptureBatch) -> None:
        self.views.append([(tuple(view.layers), view.keys is not None) for view in batch.views()])
        for layer in batch.layers:
            queries, keys = batch.sides(layer)
            for row, index in enumerate(batch.corpus_indices.tolist()):
                n_q, n_k = int(queries.lengths[row]), int(keys.lengths[row])
                pattern = batch.layers[layer].pattern
                self.patterns.setdefault(index, {})[layer] = pattern[row, :, :n_q, :n_k].clone()


def test_pairs_file_reads_pairs_and_refuses_bad_lines_in_one_line(tmp_path):
    good = tmp_path / "pairs.tsv"
    good.write_text("a b\tc d\n\nsource two\ttarget two\n", encoding="utf-8")
    corpus = load_corpus(good, pairs=True)
    assert corpus.pairs == [("a b", "c d"), ("source two", "target two")] and corpus.blank_lines == 1
    assert corpus.to_dict()["pairs"] is True and "pairs" not in load_corpus(["x"]).to_dict()
    for text, expected in [("a\tb\nno tab here\n", "line 2: 0 tabs; expected exactly one"),
                           ("a\tb\tc\n", "line 1: 2 tabs; expected exactly one"),
                           ("a\tb\n\t b\n", "line 2: the source is empty"),
                           ("a\t \n", "line 1: the target is empty")]:
        bad = tmp_path / "bad.tsv"
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=expected) as error:
            load_corpus(bad, pairs=True)
        assert "\n" not in str(error.value)


def test_list_of_pairs_is_a_corpus_of_pairs_and_bad_pairs_are_refused():
    corpus = load_corpus(PAIRS)
    assert corpus.targets == tuple(t for _, t in PAIRS) and corpus.source == "list of 4 pairs"
    with pytest.raises(ValueError, match="item 1: the target is empty"):
        load_corpus([("a", "b"), ("c", " ")])
    with pytest.raises(TypeError, match=r"item 0 .*expected a \(source, target\) tuple"):
        load_corpus([("a", "b", "c")])
    with pytest.raises(ValueError, match="pairs=True reads a pairs file"):
        load_corpus(PAIRS, pairs=True)


@pytest.mark.parametrize("name", ["bart", "marian", "t5"])
def test_captured_patterns_of_pairs_equal_eager_attentions_item_by_item(name):
    tokenizer = minilm_tokenizer()
    handle = headlab.attach(_model(name, tokenizer), tokenizer=tokenizer)
    kept = Kept()
    capture(handle, corpus=PAIRS, consumers=[kept], batch_tokens=None, max_batch_size=4, progress=False)
    assert len(kept.views) == 1  # one padded batch of every pair
    # the encoder's, the decoder's self-attention and the cross-attention layers, each a view of its own
    assert kept.views[0] == [((0, 1), False), ((2, 4), False), ((3, 5), True)]
    eager = _model(name, tokenizer, "eager")
    start = eager.config.decoder_start_token_id
    for index, (source, target) in enumerate(PAIRS):
        ids = tokenizer(source, return_tensors="pt")["input_ids"]
        target_ids = tokenizer(target, return_tensors="pt")["input_ids"]
        decoder_ids = torch.cat([torch.tensor([[start]]), target_ids[:, :-1]], dim=1)
        with torch.no_grad():
            out = eager(input_ids=ids, decoder_input_ids=decoder_ids, output_attentions=True)
        want = [*out.encoder_attentions, out.decoder_attentions[0], out.cross_attentions[0],
                out.decoder_attentions[1], out.cross_attentions[1]]
        got = kept.patterns[index]
        for layer, attention in enumerate(want):
            assert got[layer].shape == attention[0].shape, (layer, got[layer].shape, attention.shape)
            torch.testing.assert_close(got[layer], attention[0], rtol=1e-4, atol=1e-5)


def test_batch_sides_and_views_of_pairs():
    tokenizer = minilm_tokenizer()
    handle = headlab.attach(_model("bart", tokenizer), tokenizer=tokenizer)
    seen: list[CaptureBatch] = []

    class Keep:
        def update(self, batch: CaptureBatch) -> None:
            seen.append(batch)
            assert batch.target is not None
            queries, keys = batch.sides(3)  # cross-attention: target queries, source keys
            assert queries is batch.target and keys is batch
            assert batch.layers[3].sides == (TARGET, SOURCE) and batch.layers[0].sides == (SOURCE, SOURCE)
            # the decoder reads its start token, then the target less its last piece
            assert batch.target.tokens[0][0] == "[CLS]" and batch.target.tokens[0][1] == "[CLS]"
            assert batch.target.special_tokens_mask[:, 0].all()
            cross = batch.views()[2]
            assert cross.keys is batch and cross.texts == batch.target.texts and set(cross.layers) == {3, 5}
            assert cross.length_groups() == [(slice(0, len(batch)), batch.target.input_ids.shape[1])]

    result = capture(handle, corpus=PAIRS, consumers=[Keep()], progress=False)
    assert seen and result.items == 4
    assert result.tokens == sum(len(tokenizer(s)["input_ids"]) + len(tokenizer(t)["input_ids"]) for s, t in PAIRS)


def test_pairs_are_cut_to_the_limit_with_the_one_warning():
    tokenizer = minilm_tokenizer()
    handle = headlab.attach(_model("bart", tokenizer), tokenizer=tokenizer)
    long = " ".join(["word"] * 80)
    with pytest.warns(headlab.capture.TruncationWarning, match=r"2 of 3 inputs .* \(inputs 1, 2\)"):
        result = capture(handle, corpus=[("a b", "c d"), (long, "e"), ("f", long)], max_length=16, progress=False)
    assert result.truncated == [1, 2]


def test_pairs_for_a_model_that_is_not_an_encoder_decoder_fail_in_one_line(model, tokenizer):
    handle = headlab.attach(model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="pairs are for a text encoder-decoder") as error:
        capture(handle, corpus=PAIRS, progress=False)
    assert "\n" not in str(error.value)


def test_a_text_batch_is_its_own_one_view(model, tokenizer, texts):
    handle = headlab.attach(model, tokenizer=tokenizer)
    seen = []

    class Keep:
        def update(self, batch: CaptureBatch) -> None:
            assert batch.views() == [batch] and batch.views()[0] is batch and batch.target is None
            assert all(taken.sides == (SOURCE, SOURCE) for taken in batch.layers.values())
            seen.append(batch.sides(0))

    capture(handle, corpus=texts, consumers=[Keep()], progress=False)
    assert seen and all(q is k for q, k in seen)
