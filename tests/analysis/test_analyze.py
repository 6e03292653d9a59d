"""``analyze`` end to end: MiniLM (bidirectional) and a tiny random GPT-2 (causal)."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch
import transformers

import headlab
from headlab.analysis import STATISTICS, ImportanceResult, ProbeScores
from headlab.analysis.analyze import (
    FIDELITY_METRIC,
    LM_METRIC,
    RETRIEVAL_METRIC,
    TABLE_RELATIONS,
    AnalysisResult,
    analyze,
)
from headlab.heads import Heads, HeadTable
from headlab.models import HeadedModel
from tests.support.analysis import hand_result, relation
from tests.support.minilm import minilm
from tests.support.text import ENGLISH, fake_tokenizer
from tests.support.tiny import build

TEXTS = ENGLISH[:6]


def test_minilm_rows_files_and_summary_agree(tmp_path):
    result = analyze(minilm(), TEXTS, quick=True, streaming=False, progress=False)
    rows = result.rows()
    assert len(rows) == 72
    assert {(r["layer"], r["head"]) for r in rows} == {(layer, h) for layer in range(6) for h in range(12)}
    summary = result.summary()
    assert summary["items"] == len(TEXTS)
    assert sum(summary["class_shares"].values()) == pytest.approx(1.0)
    assert sum(summary["role_counts"].values()) == sum(len(v) for v in result.roles.values())
    assert "causal probes" in result.skipped and result.probes == {}
    assert result.skipped["retrieval and streaming heads"].startswith("off: pass --streaming")
    assert result.context is None
    vw, sinks = result.value_weighted, result.sinks  # from the one capture pass: [CLS] is the sink
    assert vw.heads == sinks.heads == result.surface.heads and sinks.n_sink == 1
    assert rows[17]["weighted_sink"] == vw.value("weighted_sink", 1, 5)
    assert rows[17]["sink_raw_share"] == sinks.table.value("raw_share", 1, 5)
    assert float((vw["raw_first"] - vw["weighted_first"]).mean()) > 0.1  # [CLS] carries little (Kobayashi et al.)
    # one definition of a sink head: the role label is SinkShare's, on the corpus
    assert sorted(k for k, v in result.roles.items() if "sink" in v) == sorted(sinks.sink_heads())
    assert sum(r["sink_head"] == 1 for r in rows) == sum("sink" in r["roles"].split() for r in rows)
    gradient = result.importance["gradient"].table
    assert gradient.heads == [(layer, h) for layer in range(6) for h in range(12)]
    assert [r["importance_gradient"] for r in rows] == [gradient.value("score", r["layer"], r["head"]) for r in rows]
    assert rows[17]["entropy"] == result.surface.value("entropy", 1, 5) and rows[17]["n_queries"] == int(
        result.surface.value("n_queries", 1, 5))
    assert list(result.pruning) == [FIDELITY_METRIC, RETRIEVAL_METRIC]
    fidelity, retrieval = result.pruning.values()  # the unpruned model's embeddings are its own reference
    assert fidelity.fractions == retrieval.fractions and fidelity.fractions[0] == 0.0
    assert fidelity.values[0] == pytest.approx(1.0, abs=1e-6) and min(fidelity.values[1:]) < 1.0
    assert not fidelity.flat()  # the metric the sentences lead with can move
    paths = {p.name for p in result.write(tmp_path)}
    assert {"heads.json", "heads.csv", "heatmaps.png", "mds.png", "pruning.png", "value_weighted.png",
            "sinks.png"} <= paths and "streaming.png" not in paths
    document = json.loads((tmp_path / "heads.json").read_text())  # strict JSON: NaN would not parse as such
    assert document["sinks"]["n_sink"] == 1 and document["context"] is None
    assert document["summary"]["sink_heads"] == [list(h) for h in sinks.sink_heads()]
    assert len(document["heads"]) == 72 and document["summary"]["items"] == len(TEXTS)
    with (tmp_path / "heads.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 72 and float(table[5]["entropy"]) == pytest.approx(rows[5]["entropy"])
    assert (tmp_path / "heatmaps.png").stat().st_size > 10_000


def test_minilm_selected_layers_and_heads_only():
    result = analyze(minilm(), TEXTS[:3], heads=Heads(layers=[0, 5], heads=[1, 2]), quick=True, importance=False,
                     syntax=False, streaming=True, progress=False)
    assert {(r["layer"], r["head"]) for r in result.rows()} == {(0, 1), (0, 2), (5, 1), (5, 2)}
    assert result.similarity.distances.shape == (4, 4)
    assert result.skipped["importance"] == "not asked for" and result.skipped["syntax"] == "not asked for"
    assert result.skipped["retrieval and streaming heads"].startswith(  # three lines: the other parts still run
        "the corpus is too short: the corpus holds 0 chunks of 64 tokens") and result.context is None
    assert result.value_weighted.heads == [(0, 1), (0, 2), (5, 1), (5, 2)]  # the selected heads


def test_a_layer_the_model_lacks_is_a_clear_error():
    with pytest.raises(ValueError, match="7"):
        analyze(minilm(), TEXTS[:2], heads=Heads(layers=[7]), quick=True, importance=False, syntax=False,
                progress=False)


def test_tiny_causal_model_gets_probes_and_next_token_importance():
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                               eos_token="[SEP]", bos_token="[CLS]")
    model = headlab.attach(build("gpt2", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, n_positions=128)).model
    loaded = HeadedModel(model=model, tokenizer=tok, source="tiny gpt2")
    words = "the cat sat on a big red mat and the dog ran".split()  # enough text for the copies and the windows
    texts = [" ".join(words[i % 5: i % 5 + 3 + i % 7]) for i in range(40)]
    result = analyze(loaded, texts, quick=True, syntax=False, streaming=True, progress=False)
    assert set(result.probes) == {"duplicate_token", "induction"}
    assert result.sinks.n_sink == 4 and len(result.value_weighted) == 8  # Xiao et al.'s four sink tokens
    retrieval, streaming = result.context.retrieval, result.context.streaming  # their own passes, every head
    assert len(retrieval.table) == 8 and streaming.kind == "causal" and streaming.windows == [4, 16]
    rows = result.rows()
    assert [r["retrieval_score"] for r in rows] == [retrieval.table.value("score", *h) for h in result.surface.heads]
    assert [r["streaming_loss_change_w4"] for r in rows] == list(streaming.table.at("loss_change_w4",
                                                                                     result.surface.heads))
    summary = result.summary()
    assert summary["streaming_heads"] == {str(c.window): [list(h) for h in c.heads] for c in streaming.conversions}
    assert summary["retrieval_heads"] == [list(h) for h in retrieval.retrieval_heads()]
    induction = result.probes["induction"].table
    scores = induction["induction"]
    assert len(induction) == 8 and bool(((scores >= 0) & (scores <= 1)).all())
    assert [r["induction_score"] for r in result.rows()] == [induction.value("induction", *h) for h in induction.heads]
    assert list(result.pruning) == [LM_METRIC] and all(v > 0 for v in result.pruning[LM_METRIC].values)
    assert result.causal and not any("the next one" in sentence for sentence in result.sentences())
    assert torch.isfinite(torch.tensor([r["entropy"] for r in result.rows()])).all()
    assert all(r["uniform_entropy"] < torch.log(torch.tensor(40.0)) for r in result.rows())


def test_rows_join_every_table_on_the_captured_heads():
    """``rows()``: the surface heads only, each table's value at its own head, None where a table lacks
    the head, and the columns in heads.csv's order."""
    surface = HeadTable([(0, 0), (1, 2)], {"n_queries": [7, 7], **{name: [0.25, 0.5] for name in STATISTICS}})
    gradient = HeadTable([(0, 0), (0, 1), (1, 2)], {"score": [0.1, 0.2, 0.3], "raw": [1.0, 2.0, 3.0]})
    induction = HeadTable([(1, 2), (0, 0)], {"induction": [0.9, 0.4]})
    result = AnalysisResult(
        capture=None, surface=surface, roles={(1, 2): ("sink", "induction_head")}, taxonomy=None,
        classes={(0, 0): "vertical"}, similarity=None, embedding=None,
        probes={"induction": ProbeScores("induction", induction, 0.3, n_seqs=1, length=4, seed=0),
                "duplicate_token": ProbeScores("duplicate_token", HeadTable([(0, 0)], {"duplicate_token": [0.6]}),
                                               0.3, n_seqs=1, length=4, seed=0)},
        importance={"gradient": ImportanceResult(gradient, "gradient", normalized=True, batches=1, seconds=0.0)},
    )
    rows = result.rows()
    assert list(rows[0]) == ["layer", "head", "n_queries", *STATISTICS, "roles", "pattern_class", "induction_score",
                             "duplicate_token_score", "importance_gradient"]
    assert rows[0]["n_queries"] == 7 and isinstance(rows[0]["n_queries"], int)
    assert {k: rows[0][k] for k in ("roles", "pattern_class", "induction_score", "duplicate_token_score",
                                    "importance_gradient")} == {
        "roles": "", "pattern_class": "vertical", "induction_score": 0.4, "duplicate_token_score": 0.6,
        "importance_gradient": 0.1}
    assert {k: rows[1][k] for k in ("layer", "head", "to_self", "roles", "pattern_class", "induction_score",
                                    "duplicate_token_score", "importance_gradient")} == {
        "layer": 1, "head": 2, "to_self": 0.5, "roles": "sink induction_head", "pattern_class": "",
        "induction_score": 0.9, "duplicate_token_score": None, "importance_gradient": 0.3}
    table = result.table()
    assert table.heads == surface.heads and table.value("importance_gradient", 1, 2) == 0.3


def test_sentences_leave_out_the_next_token_for_a_causal_model_and_write_heads_as_l_h():
    bidirectional = " ".join(hand_result(causal=False).sentences())
    assert ("Head L1 H0 sends 80% of its attention to the previous token and head L0 H1 60% to the next one"
            in bidirectional)
    causal = " ".join(hand_result(causal=True).sentences())
    assert "Head L1 H0 sends 80% of its attention to the previous token, while" in causal
    assert "next" not in causal
    assert not re.search(r"\bhead \d+\.\d+", bidirectional + causal, flags=re.IGNORECASE)


def test_the_syntax_headline_names_a_relation_the_table_shows_and_says_which_head_is_which():
    frequent = [relation(f"r{i}", 100 - i, accuracy=0.5, baseline=0.45) for i in range(TABLE_RELATIONS)]
    frequent[3] = relation("r3", 97, accuracy=0.7, baseline=0.4, head=(1, 1), direction="head_to_dep")
    rare = relation("mark", 29, accuracy=0.95, baseline=0.1)  # the largest gain, but below the table's cut
    (headline,) = [s for s in hand_result(causal=False, relations=[*frequent, rare]).sentences() if "relation" in s]
    assert "mark" not in headline
    assert headline == (
        f"Of the {TABLE_RELATIONS} most frequent dependency relations, r3 gains most over a fixed offset: reading "
        "from the syntactic head word of each of its 97 arcs, attention head L1 H1 puts its largest weight on the "
        "dependent word 70% of the time, against 40% for the best fixed offset (+1 word).")


def test_the_syntax_headline_says_no_relation_beats_its_baseline_when_none_does():
    losing = [relation(f"r{i}", 100 - i, accuracy=0.08 - i / 100, baseline=0.14) for i in range(TABLE_RELATIONS)]
    (headline,) = [s for s in hand_result(causal=False, relations=losing).sentences() if "relation" in s]
    assert " gains " not in headline
    assert headline.startswith(f"Of the {TABLE_RELATIONS} most frequent dependency relations, no relation beats its "
                               "positional baseline; r0 comes closest: reading from")
    assert "8% of the time, against 14% for the best fixed offset" in headline


def test_a_flat_pruning_curve_says_it_cannot_tell_heads_apart_and_a_moving_one_gives_its_values():
    from headlab.analysis import PruningCurve

    fractions = [0.0, 0.25, 0.5, 0.75, 1.0]
    flat = PruningCurve(fractions, [0, 1, 2, 3, 4], [1.0, 1.0, 1.0, 0.992, 1.0])
    moving = PruningCurve(fractions, [0, 1, 2, 3, 4], [1.0, 0.9, 0.8, 0.7, 0.5])
    assert flat.flat() and not moving.flat() and flat.to_dict()["flat"] is True
    sentences = hand_result(causal=False, pruning={FIDELITY_METRIC: moving, RETRIEVAL_METRIC: flat}).sentences()
    assert sentences[-2] == ("Masking heads least important first (gradient importance), the embedding cosine to "
                             "the unpruned model goes from 1.000 with every head to 0.800 with 50% masked and 0.500 "
                             "with 100% masked.")
    assert sentences[-1] == ("The pair-retrieval accuracy stays at 100% (between 99% and 100%) from no head masked to "
                             "100% of them: this task cannot tell the heads apart, so its pruning curve says nothing "
                             "about which heads matter.")


# ---- engines: the capture pass in this process or in shards on Ray workers, one set of accumulators


class _Shard:
    first_batch, items = 3, (0, 2)


def test_the_accumulators_pickle_and_take_a_shards_offsets():
    import pickle

    from headlab.analysis.analyze import AnalysisAccumulators

    factory = pickle.loads(pickle.dumps(AnalysisAccumulators(causal=True, parses=["p0", "p1", "p2"],
                                                             row_fraction=0.25)))
    shard = factory(_Shard())
    assert shard.names() == ["surface", "taxonomy", "similarity", "syntax"]
    assert list(shard) == [shard.surface, shard.taxonomy, shard.similarity, shard.syntax]  # what capture is given
    assert shard.value_weighted is None and shard.sinks is None
    assert shard.similarity.batches_seen == 3 and shard.similarity.row_fraction == 0.25
    assert shard.syntax.parses == ["p0", "p2"] and shard.surface.causal and shard.taxonomy.causal
    whole = factory()  # the local engine: the whole corpus
    assert whole.similarity.batches_seen == 0 and whole.syntax.parses == ["p0", "p1", "p2"]
    assert AnalysisAccumulators(causal=False)(_Shard()).names() == ["surface", "taxonomy", "similarity"]
    assert AnalysisAccumulators(causal=False).take == ("pattern",)
    W_O = {0: torch.randn(2, 3, 6)}
    with_values = pickle.loads(pickle.dumps(AnalysisAccumulators(causal=False, W_O=W_O)))
    assert with_values.take == ("pattern", "v")
    made = pickle.loads(pickle.dumps(with_values(_Shard())))  # a pass's accumulators travel back from Ray workers
    weighted, sinks = made.value_weighted, made.sinks
    assert made.names() == ["surface", "taxonomy", "similarity", "value_weighted", "sinks"] and len(made) == 5
    assert sinks.n_sink == 1 and sinks.weighted and weighted.projections is sinks.projections
    v = torch.randn(4, 2, 3)  # (token, head, d_head_v): the compact factors give the norms W_O gives
    torch.testing.assert_close(torch.einsum("thd,hde->the", v, weighted.projections.factors[0]).norm(dim=-1),
                               torch.einsum("thd,hdm->thm", v, W_O[0]).norm(dim=-1))
    assert AnalysisAccumulators(causal=True, W_O=W_O)().sinks.n_sink == 4


@pytest.mark.parametrize("options, error, match", [
    ({"engine": "spark"}, ValueError, "engine='spark' is not one of local, ray"),
    ({"engine": "ray", "workers": 0}, ValueError, "workers=0; expected a positive int"),
    ({"engine": "ray", "workers": 1.5}, ValueError, "workers=1.5; expected a positive int"),
    ({"address": "auto"}, ValueError, "address='auto' is for the Ray engine; expected engine='ray' with it"),
    ({"workers": 2}, ValueError, "workers=2 is for the Ray engine"),
])
def test_a_bad_engine_is_refused_before_any_work(options, error, match, monkeypatch):
    import headlab.analysis.analyze as module

    monkeypatch.setattr(module, "load_corpus", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(error, match=match):
        analyze(None, TEXTS, progress=False, **options)


def test_the_ray_engine_without_ray_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    needs = r"engine='ray' needs Ray, which is not installed: pip install 'headlab\[ray\]'"
    with pytest.raises(ImportError, match=needs):
        analyze(None, TEXTS, engine="ray", progress=False)


def _numbers_equal(ours, theirs, *, where="", rel=1e-12):
    """Two JSON documents equal, numbers to ``rel`` (float64 sums merged in another order: 1e-12)."""
    if isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            _numbers_equal(ours[key], theirs[key], where=f"{where}.{key}", rel=rel)
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _numbers_equal(a, b, where=f"{where}[{i}]", rel=rel)
    elif isinstance(ours, float) and isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=rel, abs=rel, nan_ok=True), where
    else:
        assert ours == theirs, where


def test_the_ray_engine_gives_the_local_result_from_the_command_line(tmp_path):
    """The whole path, run by default: the command, a local Ray of 2 workers that load the checkpoint
    directory, shards, the merge, and heads.json equal to the local engine's."""
    pytest.importorskip("ray")
    from typer.testing import CliRunner

    from headlab.cli import app
    from tests.support.tiny import save_causal_checkpoint

    checkpoint = save_causal_checkpoint(tmp_path / "tiny", n_positions=64)
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a big red mat and the dog ran".split()
    corpus.write_text("".join(" ".join(words[i % 5: i % 5 + 3 + i % 7]) + "\n" for i in range(40)))
    documents = {}
    for engine in ("local", "ray"):
        extra = ["--engine", "ray", "--workers", "2"] if engine == "ray" else []
        result = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out",
                                          str(tmp_path / engine), "--no-importance", "--no-syntax", "--no-streaming",
                                          "--json", "--max-pattern-memory", "1GiB",  # the summary states it
                                          *extra])
        assert result.exit_code == 0, result.output
        documents[engine] = json.loads(result.stdout)
    assert documents["ray"]["summary"]["items"] == 40
    _numbers_equal(documents["ray"], documents["local"])


def test_each_batch_is_freed_before_the_next_forward_with_every_accumulator():
    """What the accumulators derive from a batch (shared reductions holding the batch) must not keep it alive:
    capture reuses a batch's pattern memory for the next forward only once nothing refers to it."""
    import weakref

    from headlab.analysis.analyze import AnalysisAccumulators
    from headlab.analysis.norms import out_projections
    from headlab.capture import capture

    class Watch:
        def __init__(self):
            self.last, self.alive, self.batches = None, [], 0

        def update(self, batch):
            self.alive.append(self.last is not None and self.last() is not None)
            self.last, self.batches = weakref.ref(batch), self.batches + 1

    model, watch = minilm(), Watch()
    accumulators = AnalysisAccumulators(causal=False, W_O=out_projections(model))
    capture(model, corpus=TEXTS, consumers=[*accumulators(), watch], take=accumulators.take, max_batch_size=2,
            progress=False)
    assert watch.batches > 2 and not any(watch.alive)


def test_length_groups_leave_every_accumulator_result_as_one_padded_block_gives(monkeypatch):
    pytest.importorskip("spacy")
    from headlab.analysis.analyze import AnalysisAccumulators
    from headlab.analysis.norms import out_projections
    from headlab.analysis.parses import parse_texts
    from headlab.analysis.syntax import SyntaxAccuracy
    from headlab.capture import capture

    model = minilm()
    texts = [" ".join(TEXTS[: 1 + i % len(TEXTS)]) for i in range(12)]  # from ~8 to ~70 pieces
    accumulators = AnalysisAccumulators(causal=False, parses=parse_texts(texts), W_O=out_projections(model))

    class Groups:
        def __init__(self):
            self.counts = []

        def update(self, batch):
            self.counts.append(len(batch.length_groups()))

    def results(group_cost):
        monkeypatch.setattr("headlab.capture.batching.GROUP_COST", group_cost)
        parts, groups = accumulators(), Groups()
        capture(model, corpus=texts, consumers=[*parts, groups], take=accumulators.take, progress=False)
        tables = [(p.result(min_count=1) if isinstance(p, SyntaxAccuracy) else p.result()).to_dict() for p in parts]
        return json.loads(json.dumps(tables)), groups.counts

    whole, one = results(10**12)
    grouped, many = results(0)
    assert set(one) == {1} and max(many) > 1  # the second pass does read its batches in groups
    _numbers_equal(grouped, whole, rel=1e-6)  # float32 row sums over shorter rows: rounding only


def test_the_accumulators_taken_as_on_a_gpu_give_what_they_give_as_on_a_cpu(monkeypatch):
    # Where ops cost their launch (launch_bound: a GPU) a stack's patterns are copied into one (layer, …) tensor and
    # statistics are stacked before they are summed; on a CPU each layer's pattern is read where it lies and each
    # statistic summed on its own. Here the CPU is made to take the GPU's way.
    pytest.importorskip("spacy")
    from headlab.analysis.analyze import AnalysisAccumulators
    from headlab.analysis.norms import out_projections
    from headlab.analysis.parses import parse_texts
    from headlab.analysis.reductions import reductions
    from headlab.analysis.syntax import SyntaxAccuracy
    from headlab.capture import capture

    model = minilm()
    texts = [" ".join(TEXTS[: 1 + i % len(TEXTS)]) for i in range(12)]
    accumulators = AnalysisAccumulators(causal=False, parses=parse_texts(texts), W_O=out_projections(model))

    class Stacks:
        def __init__(self):
            self.parts = []

        def update(self, batch):
            self.parts.append([[layers for _, layers in rows.parts] for rows in reductions(batch).stacks])

    def results(joined):
        for module in ("reductions", "per_head"):
            monkeypatch.setattr(f"headlab.analysis.{module}.launch_bound", lambda device: joined)
        parts, stacks = accumulators(), Stacks()
        capture(model, corpus=texts, consumers=[*parts, stacks], take=accumulators.take, progress=False)
        tables = [(p.result(min_count=1) if isinstance(p, SyntaxAccuracy) else p.result()).to_dict() for p in parts]
        return json.loads(json.dumps(tables)), stacks.parts

    alone, one_by_one = results(False)
    together, joined = results(True)
    assert {repr(batch) for batch in one_by_one} == {repr([[slice(layer, layer + 1) for layer in range(6)]])}
    assert {repr(batch) for batch in joined} == {repr([[slice(0, 6)]])}
    _numbers_equal(together, alone, rel=1e-6)  # float32 products of other shapes: rounding only


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_accumulator_gives_on_cuda_what_it_gives_on_the_cpu():
    # On a GPU the batches, the patterns and v are CUDA tensors; W_O and the sums stay on the CPU.
    from headlab.analysis.analyze import AnalysisAccumulators
    from headlab.analysis.norms import out_projections
    from headlab.capture import capture

    def results(model):
        accumulators = AnalysisAccumulators(causal=False, W_O=out_projections(model))
        parts = accumulators()
        capture(model, corpus=TEXTS, consumers=parts, take=accumulators.take, progress=False)
        return json.loads(json.dumps([p.result().to_dict() for p in parts]))

    # float32 kernels of another device: rounding only
    _numbers_equal(results(headlab.load(device="cuda")), results(minilm()), rel=1e-4)


@pytest.mark.slow  # MiniLM loaded on 2 workers, spaCy parses, ~1 min on 2 cores
def test_the_ray_engine_gives_the_local_result_on_minilm_with_syntax():
    pytest.importorskip("ray")
    pytest.importorskip("spacy")
    texts = [f"{a} {b}" for a in TEXTS for b in TEXTS][:30]
    local = analyze(minilm(), texts, importance=False, streaming=False, progress=False)
    ray = analyze(minilm(), texts, importance=False, streaming=False, engine="ray", workers=2, progress=False)
    assert local.syntax is not None and "syntax" not in ray.skipped
    _numbers_equal(json.loads(ray.to_json()), json.loads(local.to_json()))
    assert ray.similarity.distances == pytest.approx(local.similarity.distances, rel=1e-12, abs=1e-12)


def test_past_the_pattern_memory_the_statistics_read_row_blocks_and_the_classes_are_skipped_with_the_reason():
    """The same numbers as from whole patterns; the parts that need whole patterns say why they did not run."""
    from tests.support.tiny import tiny

    model = tiny("llama")
    words = "the cat sat on a big red mat and the dog ran".split()
    texts = [" ".join(words[i % 5: i % 5 + 3 + i % 7]) for i in range(12)]
    whole = analyze(model, texts, quick=True, syntax=False, importance=False, progress=False)
    blocked = analyze(model, texts, quick=True, syntax=False, importance=False, progress=False, max_pattern_memory=3000)
    assert whole.capture.blocked == 0 and blocked.capture.blocked == blocked.capture.batches
    assert blocked.taxonomy is None and whole.taxonomy is not None and blocked.classes == {}
    for part in ("pattern classes", "syntax"):
        assert "over the budget of 3 KiB" in blocked.skipped[part] and "need them whole" in blocked.skipped[part]
    for name in whole.surface.columns:
        assert torch.allclose(torch.tensor(blocked.surface[name]), torch.tensor(whole.surface[name]), rtol=1e-4,
                              atol=1e-6, equal_nan=True), name
    assert blocked.sinks is not None and blocked.value_weighted is not None
    assert blocked.roles == whole.roles
    summary = blocked.summary()
    assert summary["blocked_batches"] == blocked.capture.batches and summary["pattern_memory"] == 3000
