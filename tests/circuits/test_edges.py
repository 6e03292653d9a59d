"""Edge patching (exact), EAP and EAP-IG (headlab.circuits.edges) against their definitions and ground truths.

- EAP is the first-order term of edge patching (finite differences of the exact patch, float64);
  EAP-IG with one step is the gradient at the midpoint of the inputs;
- edge patching equals a hand-written float64 reference by transformers hooks on a GPT-2;
- EAP-IG with many steps ranks edges as edge patching does (Spearman > 0.9);
- the planted circuits (GPT-2, grouped-query LLaMA: A → B.q) and the induction experiment's trained
  model (previous-token head → induction head, via the key) come out as the top head → head edge;
- every architecture headlab serves runs EAP.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

import headlab
from headlab.circuits import edges as edges_module
from headlab.circuits.edges import edge_attribution, edge_patching
from headlab.circuits.graph import INPUT, OUTPUT, Edge, EdgeScores, graph_edges
from headlab.circuits.inputs import own_inputs
from headlab.circuits.paths import path_patching
from headlab.circuits.runs import difference, prepare
from tests.support.circuits import A, B, induction, planted, random_pair
from tests.support.tiny import ARCHITECTURES, LIMITS, build


def _head_to_head(scores: EdgeScores) -> list[Edge]:
    return [e for e in scores.top(len(scores)) if e.sender != INPUT and e.receiver != OUTPUT]


def test_the_graph_has_every_edge_into_earlier_layers_and_key_value_heads():
    handle = headlab.attach(build("llama"))  # 2 layers, 4 query heads, 2 key/value heads
    edges = graph_edges(handle)
    into_layer_1 = [e for e in edges if e.receiver != OUTPUT and e.receiver[0] == 1]
    assert len(into_layer_1) == (4 + 2 + 2) * (1 + 4)  # q of 4 heads, k and v of 2; the input and layer 0's heads
    assert len([e for e in edges if e.receiver == OUTPUT]) == 1 + 8
    assert {e.receiver[1] for e in edges if e.role == "k"} == {0, 1}
    assert Edge((0, 3), (1, 1, "k")).label == "L0 H3 → L1 H1.k"


def _slope(handle, stream, run, edge, added, metric):
    """d metric / dt of the run with ``edge`` carrying ``t · added``, at t = 0: autograd through the patched
    forward (the receiver's input recomputed from its own stream), not through EAP's per-head products."""
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    with handle.running(grad=True):
        if edge.receiver == OUTPUT:
            with stream.hooked(final=lambda x: x + t * added):
                value = metric(handle.model(**run.inputs))
        else:
            layer, head, role = edge.receiver
            with own_inputs(handle, stream, lambda at, x, memory: {(role, head): x + t * added} if at == layer else {}):
                value = metric(handle.model(**run.inputs))
    return float(torch.autograd.grad(value, t)[0])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eap_is_the_first_order_term_of_edge_patching(name):
    """EAP's score of an edge is the slope of the edge's patch at zero."""
    handle, clean, corrupted, metric = random_pair(name)
    estimate = edge_attribution(handle, clean, corrupted, metric)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    for edge in [Edge(INPUT, (0, 1, "q")), Edge((0, 2), (1, 1, "k")), Edge((0, 0), (1, 3, "q")),
                 Edge((0, 3), (1, 0, "v")), Edge((1, 2), OUTPUT)]:
        slope = _slope(handle, stream, corrupted_run, edge, difference(clean_run, corrupted_run, edge.sender), metric)
        assert estimate[edge] == pytest.approx(slope, rel=1e-9, abs=1e-12), edge.label


def test_one_step_of_eap_ig_is_the_gradient_at_the_midpoint():
    handle, clean, corrupted, metric = random_pair("llama")
    estimate = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=1)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    embedding = handle.model.get_input_embeddings()
    with torch.no_grad():
        halfway = (embedding(clean) + embedding(corrupted)) / 2  # the tokens' embeddings halfway between the runs'
    hook = embedding.register_forward_hook(lambda module, args, output: halfway)
    try:
        edge = Edge((0, 1), (1, 0, "k"))
        slope = _slope(handle, stream, corrupted_run, edge, difference(clean_run, corrupted_run, edge.sender), metric)
    finally:
        hook.remove()
    assert estimate[edge] == pytest.approx(slope, rel=1e-9)


def test_edge_patching_equals_a_reference_by_hooks():
    """The receiver L1 H2's query alone reads the stream plus L0 H1's clean − corrupted result (GPT-2, float64)."""
    handle, clean, corrupted, metric = random_pair("gpt2")
    scores = edge_patching(handle, clean, corrupted, metric, edges=[Edge((0, 1), (1, 2, "q"))])
    reference = build("gpt2", std=0.2).double()  # the same weights, transformers' own attention
    d_head, blocks = 8, reference.transformer.h

    def results(ids):  # L0 H1's result: its z (c_proj's input) through its rows of c_proj
        seen = {}
        hook = blocks[0].attn.c_proj.register_forward_pre_hook(lambda m, args: seen.update(z=args[0]))
        with torch.no_grad():
            logits = reference(input_ids=ids).logits
        hook.remove()
        z = seen["z"][..., d_head:2 * d_head]
        return z @ blocks[0].attn.c_proj.weight[d_head:2 * d_head], logits

    (clean_result, _), (corrupted_result, corrupted_logits) = results(clean), results(corrupted)
    stream = {}

    def keep_stream(module, args):
        stream["x"] = args[0]

    def own_query(module, args, output):
        own = module.forward(blocks[1].ln_1.forward(stream["x"] + clean_result - corrupted_result))
        output = output.clone()
        output[..., 2 * d_head:3 * d_head] = own[..., 2 * d_head:3 * d_head]  # the query columns of head 2
        return output

    hooks = [blocks[1].ln_1.register_forward_pre_hook(keep_stream)]
    with torch.no_grad():
        hooks.append(blocks[1].attn.c_attn.register_forward_hook(own_query))
        patched_logits = reference(input_ids=corrupted).logits
    for hook in hooks:
        hook.remove()
    expected = float(metric(type("O", (), {"logits": patched_logits}))) - float(
        metric(type("O", (), {"logits": corrupted_logits})))
    assert scores.scores[0] == pytest.approx(expected, abs=1e-9)


def test_eap_ig_with_many_steps_ranks_edges_as_edge_patching_does():
    handle, clean, corrupted, metric = random_pair("gpt2")
    exact = edge_patching(handle, clean, corrupted, metric)
    estimate = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=20)
    assert spearmanr(exact.scores, estimate.scores).statistic > 0.9
    assert estimate.forwards == 22 and estimate.backwards == 20 and estimate.details == {"steps": 20}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_planted_circuit_is_the_top_edge(name):
    handle, clean, corrupted, metric = planted(name)
    planted_edge = Edge(A, (*B, "q"))
    receivers = [(1, h, "q") for h in range(4)] + [(1, g, r) for g in range(handle.sites[1].n_kv_heads) for r in "kv"]
    for scores in (edge_attribution(handle, clean, corrupted, metric),
                   edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=5),
                   edge_patching(handle, clean, corrupted, metric),
                   path_patching(handle, clean, corrupted, metric, receivers=receivers)):
        assert _head_to_head(scores)[0] == planted_edge, scores.method


def test_the_induction_circuit_is_the_top_edge():
    """The trained 2-layer model: a previous-token head feeds an induction head through its key (the heads as
    headlab's detectors find them; in this model every layer-1 head is an induction head)."""
    handle, clean, corrupted, metric, previous, inducing = induction()
    assert previous and inducing
    for scores in (edge_attribution(handle, clean, corrupted, metric),
                   edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=5),
                   path_patching(handle, clean, corrupted, metric,
                                 receivers=[(1, h, r) for h in range(4) for r in "qkv"])):
        top = _head_to_head(scores)[0]
        assert top.sender in previous and top.receiver[:2] in inducing and top.role == "k", (scores.method, top.label)


def _architecture_pair(name: str, edit=lambda model: None):
    """A tiny random ``name`` in float64 (any of ``ARCHITECTURES`` and ``LIMITS``; ``edit`` changes the model before
    it is attached), two inputs one token apart, and a metric of its output at the last position."""
    model = build(name).double()
    edit(model)
    handle = headlab.attach(model)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(3, 100, (1, 6), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 1) % 97 + 3
    causal = (ARCHITECTURES | LIMITS)[name].causal

    def metric(output):
        first = output.logits if causal else output.last_hidden_state
        return first[:, -1].square().mean()

    return handle, clean, corrupted, metric


def _first_order_everywhere(handle, clean, corrupted, metric, scores):
    """EAP's scores equal the slope of each edge's patch at zero, on an edge of every kind."""
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    for edge in [Edge(INPUT, (0, 1, "q")), Edge((0, 2), (1, 1, "q")), Edge((0, 1), (1, 0, "k")),
                 Edge((0, 3), (1, 0, "v")), Edge((1, 2), OUTPUT)]:
        slope = _slope(handle, stream, corrupted_run, edge, difference(clean_run, corrupted_run, edge.sender), metric)
        assert scores[edge] == pytest.approx(slope, rel=1e-8, abs=1e-12), edge.label


@pytest.mark.parametrize("name", [*sorted(ARCHITECTURES), *sorted(LIMITS)])
def test_every_architecture_gives_the_first_order_term(name):
    """Every way to a receiver's stream (by the projections with the norm run again a chunk of positions at a time;
    head by head where heads share a q norm or the layout is not recognised) gives the slope of the exact patch; the
    first call, which finds the way, and the next, which takes it, score alike."""
    handle, clean, corrupted, metric = _architecture_pair(name)
    first = edge_attribution(handle, clean, corrupted, metric)
    again = edge_attribution(handle, clean, corrupted, metric)
    assert len(first) == len(graph_edges(handle)) and bool(torch.isfinite(torch.as_tensor(first.scores)).all())
    assert first.scores == pytest.approx(again.scores, rel=1e-10, abs=1e-14)
    _first_order_everywhere(handle, clean, corrupted, metric, again)


class PositionNorm(torch.nn.Module):
    """A norm over positions (not per position): its gradient goes through the forward's graph."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


def test_chunks_of_positions_change_nothing(monkeypatch):
    handle, clean, corrupted, metric = _architecture_pair("llama")
    everything = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=2)
    monkeypatch.setattr(edges_module._Sent, "CHUNK", 1)  # one position at a time
    chunked = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=2)
    assert chunked.scores == pytest.approx(everything.scores, rel=1e-10, abs=1e-14)


def test_a_norm_over_positions_takes_the_forward_graph():
    def edit(model):
        model.transformer.h[1].ln_1 = PositionNorm()

    handle, clean, corrupted, metric = _architecture_pair("gpt2", edit)
    _first_order_everywhere(handle, clean, corrupted, metric, edge_attribution(handle, clean, corrupted, metric))


def test_bad_arguments_say_what_was_expected():
    handle, clean, corrupted, metric = random_pair("gpt2")
    with pytest.raises(ValueError, match=r"method='acdc'; expected one of \('eap', 'eap-ig'\)"):
        edge_attribution(handle, clean, corrupted, metric, method="acdc")
    with pytest.raises(ValueError, match=r"steps=0; expected a positive int"):
        edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=0)
    with pytest.raises(ValueError, match=r"same shape .* clean \(2, 8\), corrupted \(2, 7\)"):
        edge_attribution(handle, clean, corrupted[:, :7], metric)
    with pytest.raises(ValueError, match=r"score the same"):
        edge_attribution(handle, clean, clean, metric)
    with pytest.raises(ValueError, match=r"L1 H0 → L0 H1.q.* not edges of this model"):
        edge_patching(handle, clean, corrupted, metric, edges=[Edge((1, 0), (0, 1, "q"))])
    with pytest.raises(ValueError, match=r"roles=\('x',\); expected one or more of"):
        edge_attribution(handle, clean, corrupted, metric, roles=("x",))


def test_scores_show_and_write(tmp_path):
    handle, clean, corrupted, metric = random_pair("gpt2")
    scores = edge_patching(handle, clean, corrupted, metric, edges=graph_edges(handle)[:5])
    assert repr(scores).startswith("EdgeScores: edge patching, 5 edges")
    assert "<table" in scores._repr_html_()
    json_path, csv_path = scores.write(tmp_path)
    assert csv_path.read_text().count("\n") == 6 and '"method": "edge patching"' in json_path.read_text()
    with pytest.raises(ValueError, match=r"k=0; expected a positive int"):
        scores.top(0)


def test_k_composition_names_the_induction_circuit_too():
    """By the weights alone: the strongest K-composition of the trained model is a previous-token head into an
    induction head."""
    from headlab.circuits import composition_scores

    handle, _, _, _, previous, inducing = induction()
    best = composition_scores(handle, kinds="k").top("k", 1)[0]
    assert best.sender in previous and best.receiver in inducing, (best.sender, best.receiver)
    assert best.z > 3
