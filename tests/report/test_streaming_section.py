"""The retrieval and streaming section: on MiniLM (retrieval refused with its reason, the window
two-sided, attention-score memory) and on a saved causal checkpoint (retrieval scores, key/value
cache) it renders the sentences of the numbers it measured and wrote, with its plot; its sentences
follow synthetic results (GQA heads that save nothing, nothing convertible, no copying)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from headlab.analysis.context_heads import FULL, QUICK
from headlab.analysis.retrieval import RetrievalResult
from headlab.analysis.streaming import Conversion, StreamingResult
from headlab.heads import HeadTable
from headlab.report import build_report
from headlab.report.sections.streaming import (
    SECTION,
    render_streaming,
    retrieval_sentences,
    streaming_sentences,
)

pytest.importorskip("transformers")


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _build(out: Path, model: str | None = None, *, quick: bool = False) -> tuple[str, dict]:
    result = build_report(out, sections=[SECTION], model=model, quick=quick, progress=False)
    assert result.sections[0].ok, result.sections[0].error
    page = result.index.read_text(encoding="utf-8")
    body = page[page.index('id="streaming"'): page.index('id="provenance"')]
    assert (out / "assets/streaming/streaming.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="assets/streaming/streaming.png"' in body and 'href="assets/streaming/streaming.json"' in body
    return body, json.loads((out / "assets/streaming/streaming.json").read_text(encoding="utf-8"))


def _table(data: dict) -> HeadTable:
    rows = data["rows"]
    return HeadTable([(r["layer"], r["head"]) for r in rows], {c: [r[c] for r in rows] for c in data["columns"]})


def _streaming(data: dict) -> StreamingResult:
    conversions = [Conversion(c["window"], [tuple(h) for h in c["tolerant"]], [tuple(h) for h in c["heads"]],
                              c["loss_change"], c["evaluations"], c["freed"], c["unsaved"], c["units"],
                              c["saved_bytes"], c["total_bytes"], c["limit_share"]) for c in data["conversions"]]
    return StreamingResult(_table(data), data["kind"], data["windows"], data["sinks"], data["budget"], data["memory"],
                           data["loss"], data["base_loss"], data["all_heads"], conversions, data["texts"],
                           data["length"], data["seconds"])


def _retrieval(data: dict) -> RetrievalResult:
    return RetrievalResult(_table(data), data["needles"], data["steps"], data["copied"], data["seconds"])


@pytest.fixture(scope="module")
def minilm_section(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    from tests.support.minilm import minilm

    minilm()  # skips without the packaged model
    return _build(tmp_path_factory.mktemp("report"), quick=True)


def test_minilm_says_why_retrieval_does_not_apply_and_measures_streaming(minilm_section):
    body, document = minilm_section
    text = _text(body)
    assert document["retrieval"] is None and document["retrieval_not_applicable"] == "it attends both ways"
    assert "Retrieval scores do not apply to all-MiniLM-L6-v2 (packaged): it attends both ways." in text
    streaming = _streaming(document["streaming"])
    assert streaming.kind == "bidirectional" and streaming.windows == list(QUICK["windows"])
    assert streaming.length == QUICK["length"] and len(streaming.table) == 72
    for sentence in streaming_sentences(streaming, name="all-MiniLM-L6-v2 (packaged)"):
        assert " ".join(sentence.split()) in text
    assert "|i − j| ≤ W" in text and "not cache memory" in text
    for c in streaming.conversions:
        assert c.loss_change <= streaming.budget and c.unsaved == 0


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny import save_causal_checkpoint

    return save_causal_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"))


def test_a_causal_checkpoint_gets_retrieval_scores_and_a_cache(causal_checkpoint: Path, tmp_path: Path) -> None:
    body, document = _build(tmp_path, str(causal_checkpoint))
    text = _text(body)
    retrieval = _retrieval(document["retrieval"])
    assert retrieval.needles == FULL["needles"] and retrieval.steps == FULL["needles"] * (FULL["needle_length"] - 1)
    assert document["haystack_length"] == 64 - 1 - 2 * FULL["needle_length"]  # shrunk to the 64 positions
    for sentence in retrieval_sentences(retrieval, name="x", needle_length=FULL["needle_length"],
                                        haystack_length=document["haystack_length"]):
        assert " ".join(sentence.split()) in text
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>L(\d+) H(\d+)</td>", body)
    assert [(int(layer), int(head)) for _, layer, head in rows][:8] == retrieval.top(8)
    streaming = _streaming(document["streaming"])
    assert streaming.kind == "causal" and streaming.memory == "key/value cache" and streaming.length == 64
    assert streaming.base_loss > 0
    for sentence in streaming_sentences(streaming, name=Path(causal_checkpoint).name):
        assert " ".join(sentence.split()) in text


HEADS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _synthetic(kind: str = "causal", *, heads=((0, 0), (0, 1), (1, 0)), unsaved: int = 1) -> StreamingResult:
    table = HeadTable(HEADS, {"z_change_w4": [0.5, 0.02, 0.3, 1.5], "loss_change_w4": [0.01, 0.0, 0.005, 0.4],
                              "streaming_w4": [1, 1, 1, 0], "z_change_w16": [0.1, 0.01, 0.1, 0.2],
                              "loss_change_w16": [0.001, 0.0, 0.001, 0.01], "streaming_w16": [0, 0, 0, 0]})
    conversions = [Conversion(4, [(0, 1), (1, 0), (0, 0)], list(heads), 0.0123, 2, 1, unsaved, 2, 3 * 1024,
                              8 * 1024, 0.5),
                   Conversion(16, [(0, 1)], [], 0.0, 0, 0, 0, 2, 0, 8 * 1024, 0.0)]
    return StreamingResult(table, kind, [4, 16], 2, 0.02, "key/value cache" if kind == "causal" else
                           "attention scores", "a loss", 3.25, [0.9, 0.05], conversions, 3, 32)


def test_streaming_sentences_follow_the_numbers():
    said = streaming_sentences(_synthetic(), name="m")
    assert said[0] == ("Each head of m was run as a streaming head inside the model, keeping only the first 2 tokens "
                       "and the W most recent keys (its own included), on 3 corpus texts of 32 tokens, for W = 4, 16; "
                       "the loss is the a loss (3.250 for the unrestricted model).")
    assert said[1] == ("At W = 4, 3 of 4 heads change the loss by at most the budget of 0.02 on their own; converting "
                       "the cheapest 3 of them together changes it by +0.0123 (measured), freeing 1 of 2 key/value "
                       "heads, which saves 38% of the key/value cache of a 32-token text (3 KiB of 8 KiB), 50% as "
                       "texts grow long.")
    assert said[2] == ("At W = 16, 1 of 4 heads change the loss by at most the budget of 0.02 on their own, and none "
                       "can be converted: nothing is saved.")
    assert said[3].startswith("Query heads share key/value heads here") and "at W = 4, 1 of the 3 converted" in said[3]
    assert said[4] == "With every head streaming the loss changes by +0.9 at W = 4 and +0.05 at W = 16."
    assert said[5] == ("At W = 4 the head whose output z changes least is L0 H1 (2.0% of its norm); the most, L1 H1 "
                       "(150%).")
    encoder = streaming_sentences(_synthetic("bidirectional", unsaved=0), name="m")
    assert "(|i − j| ≤ W, Longformer-style)" in encoder[0] and encoder[0].endswith("the loss is the a loss.")
    assert encoder[1].startswith("An encoder keeps no key/value cache")
    assert "which saves 38% of the attention-score memory" in encoder[2]
    assert not any("Query heads share" in s for s in encoder)


def _retrieval_result(scores, attended, copied=3):
    return RetrievalResult(HeadTable(HEADS, {"score": scores, "attended": attended,
                                             "retrieved": np.asarray(scores) * 10}), 2, 10, copied)


def test_retrieval_sentences_follow_the_numbers():
    found = retrieval_sentences(_retrieval_result([0.5, 0.2, 0.05, 0.0], [0.6, 0.3, 0.1, 0.0]), name="m",
                                needle_length=6, haystack_length=40)
    assert found[0] == ("Over 2 needles of 6 tokens, each hidden at a random depth in 40 tokens of corpus text and "
                        "then copied (teacher-forced), the model's top prediction was the needle's next token at 3 "
                        "of 10 copy steps (30%).")
    assert found[1] == ("2 of 4 heads (50%) score above 0.1, Wu et al.'s threshold for a retrieval head; the highest "
                        "is L0 H0 at 0.50: its most-attended key was the token being copied at 60% of the steps.")
    none = retrieval_sentences(_retrieval_result([0.05, 0.0, 0.0, 0.01], [0.5, 0.0, 0.0, 0.1]), name="m")
    assert none[1] == ("No head scores above 0.1 (Wu et al.'s threshold for a retrieval head); the highest is L0 H0 "
                       "at 0.050.")
    never = retrieval_sentences(_retrieval_result([0.0] * 4, [0.0, 0.0, 0.4, 0.1], copied=0), name="m")
    assert "never copies the needle" in never[1] and "most often by L1 H0, at 40% of the steps" in never[1]
    assert retrieval_sentences(None, name="m", reason="it attends both ways")[0].startswith(
        "Retrieval scores do not apply to m: it attends both ways.")


def test_the_fragment_escapes_names_and_links_nothing_unwritten():
    fragment = render_streaming(["<i>said</i>"], _retrieval_result([0.5, 0.2, 0.05, 0.0], [0.6, 0.3, 0.1, 0.0]),
                                _synthetic(), name="<b>m</b>")
    assert "<b>" not in fragment and "<i>" not in fragment and "&lt;b&gt;m" in fragment
    assert "<img" not in fragment and "streaming.json" not in fragment
    assert fragment.count('<tr><td class="num">') == 4 + 2  # four heads ranked, two windows
