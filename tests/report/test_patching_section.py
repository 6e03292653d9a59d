"""The patching section: on MiniLM (similarity) and a saved causal checkpoint (an induction pair and a
logit difference) it renders the sentences of the numbers it measured and wrote, on the candidate pair of
largest gap; effects are shares of the gap only where the gap reaches MIN_GAP, raw changes below it; its
speed is the bench's interleaved ratio read from RESULTS.json, never a timing of its own run; its sentences
follow synthetic results; the pair falls back to similarity where a logit difference cannot be read."""

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
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import Timing
from headlab.heads import HeadTable
from headlab.report import build_report
from headlab.report.sections.patching import (
    MIN_GAP,
    RUN,
    SECTION,
    TOP,
    bench_rows,
    choose_pair,
    normalised,
    render_patching,
    sentences,
    similarity_candidates,
    speed_sentences,
)
from tests.support.bench import suite_result
from tests.support.tiny import tiny

pytest.importorskip("transformers")


def _build(out: Path, model: str | None = None) -> tuple[str, dict]:
    """Build a report of the section alone; its text (tags removed) and its JSON asset."""
    result = build_report(out, sections=[SECTION], model=model, progress=False)
    assert result.sections[0].ok, result.sections[0].error
    page = result.index.read_text(encoding="utf-8")
    body = page[page.index('id="patching"'): page.index('id="provenance"')]
    document = json.loads((out / "assets/patching/patching.json").read_text(encoding="utf-8"))
    plot = out / "assets/patching/patching.png"
    assert ('src="assets/patching/patching.png"' in body) == plot.exists() == (document["shown"] == "effect")
    if plot.exists():
        assert plot.read_bytes()[:4] == b"\x89PNG"
    assert 'href="assets/patching/patching.json"' in body
    return body, document


def _from_dict(data: dict) -> PatchingResult:
    rows = data["heads"]["rows"]
    table = HeadTable([(r["layer"], r["head"]) for r in rows], {c: [r[c] for r in rows] for c in ("effect", "change")})
    return PatchingResult(data["method"], table, data["clean_metric"], data["corrupted_metric"], data["forwards"],
                          data["backwards"], data["seconds"])


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _check_measured(body: str, document: dict) -> tuple[PatchingResult, PatchingResult]:
    """Every sentence the JSON's results give is on the page, the table follows the exact ranking of the column
    shown, the pair is the candidate of largest gap, and no timing of this run is on the page."""
    exact, attribution = (_from_dict(r) for r in document["results"])
    text = _text(body)
    for sentence in [*sentences(exact, attribution, definition=document["metric"]), *document["speed"]]:
        assert " ".join(sentence.split()) in text
    column = document["shown"]
    assert column == ("effect" if normalised(exact) else "change")
    assert document["spearman"] == spearman(exact.table[column], attribution.table[column])
    top = exact.table.top(column, TOP, absolute=True)
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>L(\d+) H(\d+)</td>", body)
    assert [(int(layer), int(head)) for _, layer, head in rows] == top
    gaps = document["candidate_gaps"]
    assert exact.clean_metric - exact.corrupted_metric == pytest.approx(max(gaps), rel=1e-3, abs=1e-5)
    # one run's timings stay in the JSON; the bench's sentences are taken out first, since a bench timing may by chance
    # print as this run's does
    rest = text
    for sentence in document["speed"]:
        rest = rest.replace(" ".join(sentence.split()), "")
    for seconds in (exact.seconds, attribution.seconds):
        assert f"{seconds:.3g} s" not in rest and f"{seconds * 1e3:.3g} ms" not in rest
    assert "One timed run" not in text and all("faster" not in s for s in sentences(exact, attribution,
                                                                                      definition="m"))
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
    assert document["metric_kind"] == "similarity" and document["shown"] == "effect"
    gaps = document["candidate_gaps"]
    assert len(gaps) > 10 and exact.clean_metric - exact.corrupted_metric >= MIN_GAP
    assert max(gaps) > gaps[0]  # a bundled pair tells its texts further apart than "cat" against "dog"
    text = _text(body)
    assert "Similarity metric, because the model is an encoder" in text
    assert f"Of {len(gaps)} candidate pairs it has the largest clean − corrupted gap of the metric" in text
    assert "cosine similarity of the mean-pooled output" in text


def test_minilm_states_the_benchs_interleaved_ratio_or_that_there_is_none(minilm_section: tuple[str, dict]) -> None:
    import headlab
    from headlab.bench.capture import model_name
    from headlab.bench.results import read_results
    from headlab.report.sections.bench import find_results

    _, document = minilm_section
    found = find_results()
    runs = {} if found is None else read_results(found)
    shown = ("benchmarks/RESULTS.json (absent)" if found is None else
             str(found.relative_to(Path.cwd()) if found.is_relative_to(Path.cwd()) else found))
    assert document["speed"] == speed_sentences(runs, model_name(headlab.load()), source=shown)


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny import save_causal_checkpoint

    return save_causal_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="module")
def causal_section(causal_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    return _build(tmp_path_factory.mktemp("report"), str(causal_checkpoint))


def test_a_causal_checkpoint_gets_an_induction_pair_and_a_logit_difference(causal_section: tuple[str, dict]) -> None:
    body, document = causal_section
    exact, _attribution = _check_measured(body, document)
    assert len(exact.table) == 8 and exact.forwards == 10
    clean, corrupted = document["clean_ids"], document["corrupted_ids"]
    bos, run = clean[0], clean[1: 1 + RUN]
    assert clean == [bos, *run, *run[:-1]] and len(set(run)) == RUN
    differ = [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
    assert differ == [RUN] and corrupted[RUN] not in run  # the run's last token, changed once
    assert document["metric"].startswith("logit(") and document["metric_kind"] == "logit-diff"
    # n distinct tokens: n − RUN runs of RUN consecutive ones, each with the n − RUN tokens outside it changed in
    side = round(len(document["candidate_gaps"]) ** 0.5)
    assert side > 1 and side * side == len(document["candidate_gaps"])
    text = _text(body)
    assert "The model is a causal language model, so the pair tests copying" in text
    assert "Of all 8 heads" in text  # fewer heads than TOP: no overlap of top lists to state
    assert "holds no patching row for" in text  # the bench never timed this checkpoint


def test_a_random_models_small_gap_shows_raw_changes(causal_section: tuple[str, dict]) -> None:
    body, document = causal_section
    exact, _ = (_from_dict(r) for r in document["results"])
    assert 0 < exact.clean_metric - exact.corrupted_metric < MIN_GAP  # random weights copy nothing
    assert document["shown"] == "change"
    text = _text(body)
    assert f"A gap under {MIN_GAP:g} is too small for shares of it to mean anything" in text
    assert "exact change" in text and "exact effect" not in text and "No heatmap" in text


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
    assert said[1].startswith("A head's effect is the share of that gap it recovers")
    assert said[2] == ("Exact activation patching ran 6 forwards (one per head and the two baselines); attribution "
                       "patching (AtP, Kramár et al. 2024) estimated all 4 heads from 2 forwards and 1 backward.")
    assert said[3] == ("Over the 4 heads the two methods' effects have Spearman rank correlation 1.00 (1.00 for their "
                       "magnitudes): the rankings mostly agree.")
    assert said[4] == ("Of the exact method's top 2 heads by |effect|, 2 are in AtP's top 2; AtP gives every one of "
                       "them the exact method's sign.")
    assert said[5] == ("The exact method's top head is L0 H0, with effect +0.800; AtP estimates +1.600, "
                       "overestimating it 2.00×, and ranks it first too.")


def test_sentences_change_with_the_numbers() -> None:
    exact = _result("activation", EXACT, clean=0.5, corrupted=0.2, seconds=2.0)
    attribution = _result("attribution", dict(zip(HEADS, [0.32, -0.9, 0.05, 0.01])), clean=0.5, corrupted=0.2,
                          seconds=3.0)
    said = sentences(exact, attribution, definition="a metric", top=2)
    assert said[0].endswith("a gap of 0.3.")
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


def test_a_gap_under_min_gap_gives_raw_changes_not_shares() -> None:
    clean, corrupted = 0.02, 0.007  # a gap of 0.013: a head's change of 0.025 would read as an effect of 1.9
    effects = dict(zip(HEADS, [1.9, -1.9, 0.5, 0.1]))
    exact = _result("activation", effects, clean=clean, corrupted=corrupted)
    attribution = _result("attribution", effects, clean=clean, corrupted=corrupted)
    assert clean - corrupted < MIN_GAP and not normalised(exact)
    said = sentences(exact, attribution, definition="m", top=2)
    assert said[0] == ("The metric is m: 0.02 on the clean input and 0.007 on the corrupted one, a gap of 0.013. A gap "
                       f"under {MIN_GAP:g} is too small for shares of it to mean anything: one head's patch can move "
                       "the metric by as much as the whole gap.")
    assert said[1].startswith("So each head is given by its change: how far the metric moves")
    assert "by |change|" in said[4] and said[5].startswith("The exact method's top head is L0 H0, with change +0.0247;")
    fragment = render_patching(("a", "b"), "why", exact, attribution, name="tiny", definition="m")
    assert "exact change" in fragment and "effect" not in _text(fragment).split("The top", 1)[1]
    assert "+1.900" not in fragment and "+0.0247" in fragment and "No heatmap" in fragment
    backwards = _result("activation", EXACT, clean=0.2, corrupted=0.5)  # a wide gap, but the wrong way round
    assert not normalised(backwards)
    assert "The clean input scores lower" in sentences(backwards, backwards, definition="m")[0]


def _patching_run(*rows: Comparison, device: str = "cpu") -> dict:
    run = suite_result()
    run.machine["cpu"] = "Xeon"
    run.areas.append(Area("patching", "Patching", "both methods", list(rows)))
    return {device: run}


def test_speed_is_the_benchs_interleaved_ratio_for_the_model() -> None:
    row = Comparison("model A (6 layers × 12 heads) · 9 tokens", "AtP", "exact", Timing((0.02, 0.021, 0.019)),
                     Timing((0.5, 0.49, 0.51)))
    other = Comparison("model B (2 layers × 2 heads) · 9 tokens", "AtP", "exact", Timing((1.0,)), Timing((2.0,)))
    runs = _patching_run(row, other)
    (said,) = speed_sentences(runs, "model A (6 layers × 12 heads)", source="benchmarks/RESULTS.json")
    assert said == ("Speed, read from benchmarks/RESULTS.json (not measured by this report: headlab bench --quick, "
                    "2026-01-01T00:00:00+00:00, CPU, Xeon): on the bench's pair (model A (6 layers × 12 heads) · 9 "
                    f"tokens), timed in one interleaved group ({runs['cpu'].plan.rounds} rounds, median), AtP took "
                    "20 ms and exact 500 ms: ratio 0.040 (noise 5%), 25× faster.")
    noisy = Comparison("model A (6 layers × 12 heads) · 9 tokens", "AtP", "exact", Timing((0.5, 0.9, 1.6)),
                       Timing((1.0,) * 3))
    assert speed_sentences(_patching_run(noisy), "model A (6 layers × 12 heads)", source="r")[0].endswith(
        "within noise: the rounds do not say which is faster.")


def test_bench_rows_are_the_patching_rows_of_the_model() -> None:
    row = Comparison("model A (1 layers × 2 heads) · 9 tokens", "AtP", "exact", Timing((1.0,)), Timing((2.0,)))
    runs = _patching_run(row)
    runs["cpu"].areas[0].rows.append(Comparison("model A (1 layers × 2 heads) · 9 tokens", "x", "y", Timing((1.0,)),
                                                Timing((1.0,))))  # another area's row of the same case
    assert bench_rows(runs, "model A (1 layers × 2 heads)") == [("cpu", runs["cpu"], row)]
    assert bench_rows(runs, "model A") == []  # the whole name, then the case's separator


def test_speed_without_a_bench_row_says_so_and_states_no_number() -> None:
    for runs in ({}, _patching_run()):
        (said,) = speed_sentences(runs, "my model (2 layers × 2 heads)", source="benchmarks/RESULTS.json")
        assert said.startswith("Speed: benchmarks/RESULTS.json holds no patching row for my model (2 layers × 2 heads)"
                               ", so none is stated here")
        assert not re.search(r"\d", said.replace("(2 layers × 2 heads)", "").replace("RESULTS", ""))


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
    pair = choose_pair(loaded, candidates=[("the cat sat", "the qzx sat")])  # qzx: three pieces in this vocabulary
    assert pair.name == "similarity" and pair.clean.shape == pair.corrupted.shape == (1, 5)
    assert (pair.clean != pair.corrupted).nonzero().tolist() == [[0, 2]]
    assert "tokenize to different lengths, so the corrupted input is the clean one with token 2 swapped" in pair.why
    with pytest.raises(ValueError, match="'The  CAT' tokenizes as 'the cat' does, or as a prefix or extension"):
        choose_pair(loaded, candidates=[("the cat", "The  CAT")])  # lower-cased, split on spaces: the same tokens


def test_an_attached_model_is_taken_through_its_handle() -> None:
    import headlab
    from tests.support.text import word_piece_tokenizer
    from tests.support.tiny import build

    tok = word_piece_tokenizer()
    net = headlab.attach(build("bert", num_hidden_layers=1, num_attention_heads=2, vocab_size=len(tok),
                               pad_token_id=tok.pad_token_id, attn_implementation="sdpa"), tokenizer=tok).model
    pair = choose_pair(net, candidates=[("the cat sat", "the qzx sat")])  # the module: its handle holds the tokenizer
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


def test_the_candidate_of_largest_gap_is_chosen_and_its_gap_is_the_metrics() -> None:
    loaded = tiny("bert")
    candidates = [("the cat sat on the mat", "the dog sat on the mat"),
                  ("the cat sat on the mat", "a big red dog ran on")]
    alone = [choose_pair(loaded, candidates=[c]) for c in candidates]
    for pair in alone:
        with torch.no_grad():
            clean, corrupted = (float(pair.metric(loaded.model(**loaded.inputs(ids))))
                                for ids in (pair.clean, pair.corrupted))
        assert pair.gaps[0] == pytest.approx(clean - corrupted, abs=1e-5)
        assert "It is the only candidate pair scored." in pair.why
    both = choose_pair(loaded, candidates=candidates)
    best = int(np.argmax([p.gaps[0] for p in alone]))
    assert both.gaps == pytest.approx([p.gaps[0] for p in alone], abs=1e-5)
    assert torch.equal(both.corrupted, alone[best].corrupted)
    assert f"Of 2 candidate pairs it has the largest clean − corrupted gap of the metric, {both.gaps[best]:.4g}" in (
        both.why)
    # a pair that needs a swapped token is taken only when no candidate tokenizes to equal lengths
    swapped = choose_pair(loaded, candidates=[("the cat sat", "the qzx sat"), candidates[0]])
    assert len(swapped.gaps) == 1 and "differ in 1 of their" in swapped.why
    assert "Not scored: 1 whose texts tokenize to different lengths of 2 candidates." in swapped.why
    unknown = choose_pair(loaded, candidates=[("the cat", "The  CAT"), candidates[0]])  # one refused, one kept
    assert len(unknown.gaps) == 1 and "Not scored: 1 whose texts tokenize alike of 2 candidates." in unknown.why


def test_the_default_candidates_are_the_pair_and_the_bundled_near_misses() -> None:
    from headlab.data.pairs import load_pairs

    texts = similarity_candidates()
    assert texts[0] == ("The cat sat on the mat.", "The dog sat on the mat.")
    assert texts[1:] == [(p.sentence_a, p.sentence_b) for p in load_pairs(labels=("near-miss",))]
