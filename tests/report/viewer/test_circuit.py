"""The viewer's circuit payload (headlab.report.viewer.circuit): each head's strongest incoming and outgoing
edges, picked from edge scores as a brute-force reading of the graph picks them, bounded, with a grouped-query
layer's k and v edges attached to every query head that reads the key/value head; absent without scores."""

from __future__ import annotations

import json

import numpy as np
import pytest

import headlab
from headlab.capture import run_with_cache
from headlab.circuits.graph import INPUT, OUTPUT, Edge, EdgeScores, graph_edges
from headlab.report.viewer import circuit_view, show, view_data
from headlab.report.viewer.encoding import script_json
from tests.support.circuits import CLEAN, CORRUPTED, tiny_edges
from tests.support.tiny import tiny


def _scores(edges: list[Edge], seed: int = 0, **metrics: float) -> EdgeScores:
    values = np.random.default_rng(seed).normal(size=len(edges))
    return EdgeScores("eap", edges, values, metrics.get("clean", 1.0), metrics.get("corrupted", 0.5), 3, 1, 0.0)


def _into(edge: Edge, layer: int, head: int, kv_head_of: list[tuple[int, ...]]) -> bool:
    """Whether ``edge`` reaches query head ``(layer, head)``: into its q, or into the k / v of the head it reads."""
    if isinstance(edge.receiver, str):  # the output
        return False
    r_layer, r_head, role = edge.receiver
    return r_layer == layer and r_head == (head if role == "q" else kv_head_of[layer][head])


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_each_head_lists_its_strongest_edges_each_way(kind: str) -> None:
    model = tiny(kind)
    kv_head_of = [site.kv_head_of for site in model.sites]
    scores = _scores(graph_edges(model))
    view = circuit_view(scores, kv_head_of, top=3)
    ranked = scores.top(len(scores))  # largest |score| first, ties in graph order
    assert sorted(view.heads) == [(layer, h) for layer in range(2) for h in range(4)]
    for (layer, head), mine in view.heads.items():
        into = [e for e in ranked if _into(e, layer, head, kv_head_of)]
        out = [e for e in ranked if e.sender == (layer, head)]
        assert [f"{e.sender} → {e.receiver}" for e in mine.incoming] == [e.label for e in into[:3]]
        assert [f"{e.sender} → {e.receiver}" for e in mine.outgoing] == [e.label for e in out[:3]]
        assert (mine.n_incoming, mine.n_outgoing) == (len(into), len(out))
        for shown, edge in zip(mine.incoming + mine.outgoing, into[:3] + out[:3]):
            assert shown.score == scores[edge] and shown.role == (edge.role or "output")
            assert shown.effect == pytest.approx(scores[edge] / 0.5)
    # a layer-0 head hears only the input; a layer-1 head sends only to the output
    assert {e.sender for e in view.heads[(0, 1)].incoming} == {INPUT}
    assert {e.receiver for e in view.heads[(1, 1)].outgoing} == {OUTPUT}


def test_grouped_query_heads_share_their_key_value_heads_edges() -> None:
    model = tiny("llama")
    assert model.sites[1].kv_head_of == (0, 0, 1, 1)
    scores = _scores(graph_edges(model), seed=1)
    payload = circuit_view(scores, [s.kv_head_of for s in model.sites], top=50).to_dict()["heads"]
    shared = [e for e in payload["1.3"]["in"] if e["role"] in "kv"]
    assert {e["receiver"] for e in shared} == {"L1 H1.k", "L1 H1.v"}  # key/value head 1, not "L1 H3.k"
    assert shared == [e for e in payload["1.2"]["in"] if e["role"] in "kv"]  # its group-mate lists the same
    assert payload["1.3"]["kvHead"] == 1 and payload["1.3"]["kvGroup"] == [2, 3]
    assert payload["1.0"]["kvHead"] == 0 and payload["1.0"]["kvGroup"] == [0, 1]
    # an outgoing edge into a key/value head leads to every query head that reads it
    to_kv = next(e for e in payload["0.2"]["out"] if e["receiver"] == "L1 H1.k")
    assert to_kv["heads"] == [[1, 2], [1, 3]] and to_kv["label"] == "L0 H2 → L1 H1.k"
    to_q = next(e for e in payload["0.2"]["out"] if e["receiver"] == "L1 H3.q")
    assert to_q["heads"] == [[1, 3]]
    from_head = next(e for e in payload["1.3"]["in"] if e["sender"] == "L0 H0")
    assert from_head["heads"] == [[0, 0]] and all(e["heads"] == [] for e in payload["1.3"]["in"]
                                                 if e["sender"] == "input")
    # without grouping there is no key/value head to name
    ungrouped = circuit_view(_scores(graph_edges(tiny("gpt2"))), [s.kv_head_of for s in tiny("gpt2").sites])
    assert all(h.kv_head is None and h.kv_group == () for h in ungrouped.heads.values())


def test_the_payload_is_bounded_and_keeps_only_shown_heads_with_edges() -> None:
    model = tiny("gpt2")
    edges = graph_edges(model)
    values = np.random.default_rng(2).normal(size=len(edges))
    silent = (0, 3)  # every edge into or out of it scored zero; and one edge not a number
    values[[i for i, e in enumerate(edges) if e.sender == silent or _into(e, *silent, [(0, 1, 2, 3)] * 2)]] = 0.0
    values[edges.index(Edge(INPUT, OUTPUT))] = np.nan
    scores = EdgeScores("edge patching", edges, values, 2.0, 2.0, 80, 0, 0.0)  # no gap: no effect
    kv = [s.kv_head_of for s in model.sites]
    view = circuit_view(scores, kv, heads=[(0, 0), (0, 3), (1, 2)], top=2)
    assert sorted(view.heads) == [(0, 0), (1, 2)]  # (0, 3) has no edge left; the others are not shown
    assert all(len(h.incoming) <= 2 and len(h.outgoing) <= 2 for h in view.heads.values())
    assert view.heads[(1, 2)].n_incoming == 3 * 4  # q, k and v from the input and 3 heads of layer 0 (not (0, 3))
    assert all(e.effect is None for h in view.heads.values() for e in h.incoming + h.outgoing)
    payload = view.to_dict()
    assert set(payload["heads"]) == {"0.0", "1.2"} and payload["edges"] == len(edges)
    assert payload["method"] == "edge patching" and payload["top"] == 2
    script_json(payload)  # JSON-safe: no NaN
    everything = circuit_view(scores, kv, top=5).to_dict()
    assert len(json.dumps(everything)) < 2 * 8 * 5 * 250  # at most 2 · top edges per head of a few hundred bytes


def test_refusals_name_what_was_wrong() -> None:
    model = tiny("gpt2")
    scores = _scores(graph_edges(model))
    kv = [s.kv_head_of for s in model.sites]
    with pytest.raises(ValueError, match=r"top=0; expected a positive int"):
        circuit_view(scores, kv, top=0)
    with pytest.raises(ValueError, match=r"texts=.*expected \(clean, corrupted\)"):
        circuit_view(scores, kv, texts=("only one",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"edge input → L1 H0.q names a head this model does not have .* another"):
        circuit_view(scores, kv[:1])  # scores of a 2-layer model read as a 1-layer one's
    with pytest.raises(ValueError, match=r"edge input → L0 H1.k .* key/value heads \[1\]"):
        circuit_view(_scores([Edge(INPUT, (0, 1, "k"))]), [(0, 0, 0, 0)])
    with pytest.raises(ValueError, match=r"heads \[\(2, 0\)\] are not heads of this model"):
        circuit_view(scores, kv, heads=[(1, 0), (2, 0)])
    with pytest.raises(ValueError, match=r"edge_texts .* pass the scores too"):
        view_data(model, CLEAN, edge_texts=(CLEAN, CORRUPTED))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_view_data_carries_the_circuit_of_the_shown_heads(kind: str) -> None:
    model, scores = tiny(kind), tiny_edges(kind)
    data = view_data(model, CLEAN, heads={1: [0, 3]}, edges=scores, edge_texts=(CLEAN, CORRUPTED), top_edges=4)
    circuit = data.to_dict()["circuit"]
    assert circuit["method"] == "eap" and circuit["clean"] == CLEAN and circuit["corrupted"] == CORRUPTED
    assert (circuit["cleanMetric"], circuit["corruptedMetric"]) == (scores.clean_metric, scores.corrupted_metric)
    assert set(circuit["heads"]) == {"1.0", "1.3"}
    expected = circuit_view(scores, [s.kv_head_of for s in model.sites], top=4).heads[(1, 3)]
    assert data.circuit is not None and data.circuit.heads[(1, 3)] == expected
    assert circuit["heads"]["1.3"]["kvGroup"] == ([2, 3] if kind == "llama" else [])
    assert "the strongest eap edges of each head" in repr(data)
    # without scores: no circuit
    plain = view_data(model, CLEAN, heads={1: [0]})
    assert plain.circuit is None and plain.to_dict()["circuit"] is None


def test_show_passes_the_scores_through_and_a_cache_refuses_them() -> None:
    model, scores = tiny("gpt2"), tiny_edges("gpt2")
    viewer = show(model, CLEAN, edges=scores, edge_texts=(CLEAN, CORRUPTED), top_edges=2)
    assert viewer.data.circuit is not None and viewer.data.circuit.top == 2
    assert '"circuit":{"method":"eap"' in viewer.html()
    cache = run_with_cache(model, CLEAN, take=("pattern",))
    with pytest.raises(TypeError, match=r"show\(Cache, edges=...\): the circuit panel needs the model's key/value"):
        show(cache, edges=scores)
    with pytest.raises(TypeError, match=r"show\(ViewerData, edges=...\)"):
        show(viewer.data, edges=scores)
    assert headlab.show is show
