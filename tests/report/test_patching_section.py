"""The patching section: on MiniLM (similarity) and a saved causal checkpoint (an induction pair and a
logit difference) it renders the sentences of the numbers it measured and wrote; its sentences follow
synthetic results; the pair falls back to similarity where a logit difference cannot be read."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from headlab.analysis.importance import spearman
from headlab.analysis.patching import PatchingResult
from headlab.heads import HeadTable
from headlab.report import build_report
from headlab.report.sections.patching import RUN, SECTION, TOP, choose_pair, render_patching, sentences
from tests.support.tiny import tiny

pytest.importorskip("transformers")


def _build(out: Path, model: str | None = None) -> tuple[str, dict]:
    """Build a report of the section alone; its text (tags removed) and its JSON asset."""
    result = build_report(out, sections=[SECTION], model=model, progress=False)
    assert result.sections[0].ok, result.sections[0].error
    page = result.index.read_text(encoding="utf-8")
    body = page[page.index('id="patching"'): page.index('id="provenance"')]
    assert (out / "assets/patching/patching.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="assets/patching/patching.png"' in body and 'href="assets/patching/patching.json"' in body
    return body, json.loads((out / "assets/patching/patching.json").read_text(encoding="utf-8"))


def _from_dict(data: dict) -> PatchingResult:
    rows = data["heads"]["rows"]
    table = HeadTable([(r["layer"], r["head"]) for r in rows], {c: [r[c] for r in rows] for c in ("effect", "change")})
    return PatchingResult(data["method"], table, data["clean_metric"], data["corrupted_metric"], data["forwards"],
                          data["backwards"], data["seconds"])


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _check_measured(body: str, document: dict) -> tuple[PatchingResult, PatchingResult]:
    """Every sentence the JSON's results give is on the page, and the table follows the exact ranking."""
    exact, attribution = (_from_dict(r) for r in document["results"])
    text = _text(body)
    for sentence in sentences(exact, attribution, definition=document["metric"]):
        assert " ".join(sentence.split()) in text
    assert document["spearman"] == spearman(exact.table["effect"], attribution.table["effect"])
    top = exact.table.top("effect", TOP, absolute=True)
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>L(\d+) H(\d+)</td>", body)
    assert [(int(layer), int(head)) for _, layer, head in rows] == top
    return exact, attribution


@pytest.fixture(scope="module")
def minilm_section(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    from tests.support.minilm import minilm

    minilm()  # skips without the packaged model
    return _build(tmp_path_factory.mktemp("report"))


def test_minilm_renders_the_numbers_it_measured(minilm_section: tuple[str, dict]) -> None:
    body, document = minilm_section
    exact, attribution = _check_measured(body, document)
    assert (exact.method, attribution.method) == ("activation", "attribution")
    assert (exact.forwards, exact.backwards, attribution.forwards, attribution.backwards) == (74, 0, 2, 1)
    assert exact.clean_metric == pytest.approx(1.0) and exact.corrupted_metric < 1.0
    assert document["metric_kind"] == "similarity"
    assert document["clean"] == "[CLS] the cat sat on the mat. [SEP]"
    assert document["corrupted"] == "[CLS] the dog sat on the mat. [SEP]"
    text = _text(body)
    assert "Similarity metric, because the model is an encoder" in text and "differ in 1 of their 9 tokens" in text
    assert "cosine similarity of the mean-pooled output" in text


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny import save_causal_checkpoint

    return save_causal_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"))


def test_a_causal_checkpoint_gets_an_induction_pair_and_a_logit_difference(causal_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    body, document = _build(tmp_path, str(causal_checkpoint))
    exact, _attribution = _check_measured(body, document)
    assert len(exact.table) == 8 and exact.forwards == 10
    clean, corrupted = document["clean_ids"], document["corrupted_ids"]
    bos, run = clean[0], clean[1: 1 + RUN]
    assert clean == [bos, *run, *run[:-1]] and len(set(run)) == RUN
    differ = [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
    assert differ == [RUN] and corrupted[RUN] not in run  # the run's last token, changed once
    assert (document["metric"], document["metric_kind"]) == ("logit('big') − logit('red') at the last position",
                                                             "logit-diff")
    assert document["clean"] == "[CLS] the cat sat on a big the cat sat on a"
    text = _text(body)
    assert "The model is a causal language model, so the pair tests copying" in text
    assert "Of all 8 heads" in text  # fewer heads than TOP: no overlap of top lists to state


def _result(method: str, effects: dict[tuple[int, int], float], *, clean: float = 1.0, corrupted: float = 0.5,
            seconds: float = 1.0) -> PatchingResult:
    effect = np.array(list(effects.values()))
    passes = (len(effects) + 2, 0) if method == "activation" else (2, 1)
    return PatchingResult(method, HeadTable(list(effects), {"effect": effect, "change": effect * (clean - corrupted)}),
                          clean, corrupted, *passes, seconds)


HEADS = [(0, 0), (0, 1), (1, 0), (1, 1)]
EXACT = dict(zip(HEADS, [0.8, 0.1, -0.05, 0.01]))


def test_sentences_state_agreement_and_an_overestimate() -> None:
    exact = _result("activation", EXACT, seconds=2.0)
    attribution = _result("attribution", dict(zip(HEADS, [1.6, 0.12, -0.04, 0.02])), seconds=0.05)
    said = sentences(exact, attribution, definition="a metric", top=2)
    assert said[0] == "The metric is a metric: 1 on the clean input and 0.5 on the corrupted one, a gap of 0.5."
    assert ("exact activation patching ran 6 forwards (one per head and the two baselines) in 2 s; attribution "
            "patching (AtP, Kramár et al. 2024) estimated all 4 heads from 2 forwards and 1 backward in 50 ms, "
            "40× faster.") in said[2]
    assert said[3] == ("Over the 4 heads the two methods' effects have Spearman rank correlation 1.00 (1.00 for their "
                       "magnitudes): the rankings mostly agree.")
    assert said[4] == ("Of the exact method's top 2 heads by |effect|, 2 are in AtP's top 2; AtP gives every one of "
                       "them the exact method's sign.")
    assert said[5] == ("The exact method's top head is L0 H0, with effect +0.800; AtP estimates +1.600, "
                       "overestimating it 2.00×, and ranks it first too.")


def test_sentences_change_with_the_numbers() -> None:
    exact = _result("activation", EXACT, clean=0.2, corrupted=0.5, seconds=2.0)
    attribution = _result("attribution", dict(zip(HEADS, [0.32, -0.9, 0.05, 0.01])), clean=0.2, corrupted=0.5,
                          seconds=3.0)
    said = sentences(exact, attribution, definition="a metric", top=2)
    assert "a gap of -0.3. The clean input scores lower, so the model does not show the behaviour" in said[0]
    assert said[2].endswith("in 3 s, 1.5× slower.")
    assert "Spearman rank correlation 0.20" in said[3]
    assert said[3].endswith("the rankings disagree: read AtP's table as a guess to check, not as a measurement.")
    assert said[4].endswith("2 are in AtP's top 2; AtP gives 1 of them the opposite sign.")
    assert said[5] == ("The exact method's top head is L0 H0, with effect +0.800; AtP estimates +0.320, "
                       "underestimating it (0.40× the exact effect), and ranks it 2nd; AtP's first is L0 H1, "
                       "whose exact effect is +0.100.")
    flipped = _result("attribution", dict(zip(HEADS, [-0.5, 0.1, -0.05, 0.01])))
    assert "AtP estimates -0.500, the opposite sign, and ranks it first too." in sentences(exact, flipped,
                                                                                          definition="m")[5]
    close = _result("attribution", dict(zip(HEADS, [0.9, 0.1, -0.05, 0.01])))
    assert "AtP estimates +0.900 (1.12× the exact effect), and ranks it first too." in sentences(exact, close,
                                                                                                definition="m")[5]


def test_fragment_escapes_the_texts_and_tables_every_head_up_to_top() -> None:
    exact = _result("activation", EXACT)
    attribution = _result("attribution", dict(zip(HEADS, [1.6, 0.12, -0.04, 0.02])))
    fragment = render_patching(("<b>clean</b>", "x & y"), "Why <i>.", exact, attribution, name="tiny",
                               definition="m")
    assert "<b>" not in fragment and "<i>" not in fragment and "&lt;b&gt;clean" in fragment and "x &amp; y" in fragment
    assert "<img" not in fragment and "patching.json" not in fragment  # nothing written, nothing linked
    assert fragment.count("<tr><td class=\"num\">") == 4
    assert '<td class="num">2.00</td><td class="num">1</td>' in fragment  # AtP / exact and AtP's rank, top head


def test_texts_of_different_lengths_swap_one_token() -> None:
    loaded = tiny("bert")
    pair = choose_pair(loaded, clean="the cat sat", corrupted="the qzx sat")  # qzx: three pieces in this vocabulary
    assert pair.name == "similarity" and pair.clean.shape == pair.corrupted.shape == (1, 5)
    assert (pair.clean != pair.corrupted).nonzero().tolist() == [[0, 2]]
    assert "tokenize to different lengths, so the corrupted input is the clean one with token 2 swapped" in pair.why
    with pytest.raises(ValueError, match="'The  CAT' tokenizes as 'the cat' does, or as a prefix or extension"):
        choose_pair(loaded, clean="the cat", corrupted="The  CAT")  # lower-cased, split on spaces: the same tokens


def test_an_attached_model_is_taken_through_its_handle() -> None:
    import headlab
    from tests.support.text import word_piece_tokenizer
    from tests.support.tiny import build

    tok = word_piece_tokenizer()
    net = headlab.attach(build("bert", num_hidden_layers=1, num_attention_heads=2, vocab_size=len(tok),
                               pad_token_id=tok.pad_token_id, attn_implementation="sdpa"), tokenizer=tok).model
    pair = choose_pair(net, clean="the cat sat", corrupted="the qzx sat")  # the module: its handle holds the tokenizer
    assert pair.name == "similarity" and (pair.clean != pair.corrupted).nonzero().tolist() == [[0, 2]]


def test_a_causal_model_without_logits_falls_back_to_similarity() -> None:
    import transformers

    import headlab
    from headlab.models import HeadedModel

    lm = tiny("gpt2")
    torch.manual_seed(0)
    base = transformers.GPT2Model(lm.model.config).eval()  # the same shape, no language-model head
    pair = choose_pair(HeadedModel(model=headlab.attach(base).model, tokenizer=lm.tokenizer, source="base"))
    assert pair.name == "similarity" and "causal but its output has no logits" in pair.why
    assert choose_pair(lm).name == "logit-diff"
