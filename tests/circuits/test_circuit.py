"""A circuit (headlab.circuits.circuit): the top edges, their faithfulness by forwards, the curve and the figures.

- every edge: the clean run (faithfulness 1); no edge: the corrupted run exactly in an attention-only
  model, not in a GPT-2, whose MLPs stay clean;
- a circuit of one edge equals a hand-written float64 reference by transformers hooks on a GPT-2;
- the planted circuit's A → B.q edge is what makes a small circuit faithful;
- one extra attention call per distinct stream of its own, none for the whole graph;
- the path method scores every edge (heads by path patching, the input by edge patching);
- top_edges' choices and errors, the files written, the figures, the short display.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

import headlab
from headlab.circuits import inputs
from headlab.circuits.circuit import (
    Circuit,
    faithfulness,
    faithfulness_curve,
    plot_circuit,
    plot_faithfulness,
    score_edges,
    top_edges,
)
from headlab.circuits.edges import edge_attribution, edge_patching
from headlab.circuits.graph import INPUT, OUTPUT, Edge, EdgeScores, graph_edges
from headlab.circuits.paths import path_patching
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from tests.support.circuits import A, B, planted, random_pair
from tests.support.tiny import build


def _attention_only():
    """headlab's TinyTransformer (no MLPs), three layers, the last grouped-query, float64."""
    torch.manual_seed(0)
    layers = [AttentionConfig(d_model=16, n_heads=4), AttentionConfig(d_model=16, n_heads=2),
              AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2)]
    handle = headlab.attach(TinyTransformer(vocab_sizes=[11], n_classes=5, max_len=12, layers=layers).double().eval())
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 11, (3, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 3) % 11

    def metric(output):
        return (output.logits[:, -1, 1] - output.logits[:, -1, 3]).mean()

    return handle, clean, corrupted, metric


def _scored(handle, clean, corrupted, metric) -> EdgeScores:
    return edge_attribution(handle, clean, corrupted, metric)


def test_in_an_attention_only_model_every_edge_is_the_clean_run_and_none_the_corrupted_run():
    handle, clean, corrupted, metric = _attention_only()
    scores = _scored(handle, clean, corrupted, metric)
    every = top_edges(scores, k=len(scores))
    assert faithfulness(handle, clean, corrupted, metric, every) == pytest.approx(1, abs=1e-6)
    empty = top_edges(scores, k=0)
    assert faithfulness(handle, clean, corrupted, metric, empty) == pytest.approx(0, abs=1e-9)
    assert empty.faithfulness == pytest.approx(0, abs=1e-9)  # stored on the circuit


def test_in_a_gpt2_no_edge_is_not_the_corrupted_run():
    """The MLPs (and everything else but the heads) stay clean: the empty circuit keeps some of the behaviour."""
    handle, clean, corrupted, metric = random_pair("gpt2")
    scores = _scored(handle, clean, corrupted, metric)
    every = top_edges(scores, k=len(scores))
    assert faithfulness(handle, clean, corrupted, metric, every) == pytest.approx(1, abs=1e-6)
    assert abs(faithfulness(handle, clean, corrupted, metric, top_edges(scores, k=0))) > 1e-3


def test_a_circuit_of_one_edge_equals_a_reference_by_hooks():
    """The circuit {input → L0 H2.v} on a GPT-2 (float64), by transformers hooks: L0 H2's value reads the clean
    stream and every other layer-0 input the corrupted one; layer 1 and the output read their stream minus the
    input's and every head's (now − corrupted) difference."""
    handle, clean, corrupted, metric = random_pair("gpt2")
    one = Circuit("by hand", [Edge(INPUT, (0, 2, "v"))], np.ones(1))
    measured = faithfulness(handle, clean, corrupted, metric, one)
    empty = faithfulness(handle, clean, corrupted, metric, Circuit("", [], np.ones(0)))

    reference = build("gpt2").double()  # the same weights, transformers' own attention
    d_head, blocks = 8, reference.transformer.h

    def results(z, layer):  # (batch, head, pos, d_model): each head's z through its rows of c_proj
        weight = blocks[layer].attn.c_proj.weight
        return torch.stack([z[..., h * d_head:(h + 1) * d_head] @ weight[h * d_head:(h + 1) * d_head]
                            for h in range(4)], dim=1)

    def forward(ids, *, patched=None):
        """The logits, the embeddings and every head's result; ``patched``: the corrupted run's, for the circuit."""
        seen, hooks = {}, []
        for layer in range(2):
            hooks.append(blocks[layer].attn.c_proj.register_forward_pre_hook(
                lambda m, args, layer=layer: seen.__setitem__(layer, results(args[0], layer))))
        hooks.append(blocks[0].ln_1.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0])))
        if patched is not None:
            def layer_0(module, args, output):  # every input of layer 0 from the corrupted stream, but L0 H2's value
                own = module.forward(blocks[0].ln_1.forward(patched["x"]))
                value = slice(64 + 2 * d_head, 64 + 3 * d_head)  # c_attn's columns: q, k, v of 32 each
                own[..., value] = output[..., value]
                return own

            def minus(layers):
                def edit(module, args):
                    x = args[0] - (seen["x"] - patched["x"])
                    for layer in layers:
                        x = x - (seen[layer] - patched[layer]).sum(1)
                    return (x,)
                return edit

            hooks += [blocks[0].attn.c_attn.register_forward_hook(layer_0),
                      blocks[1].ln_1.register_forward_pre_hook(minus([0])),
                      reference.transformer.ln_f.register_forward_pre_hook(minus([0, 1]))]
        with torch.no_grad():
            logits = reference(input_ids=ids).logits
        for hook in hooks:
            hook.remove()
        return float(metric(type("O", (), {"logits": logits}))), seen

    (m_clean, _), (m_corrupted, corrupted_run) = forward(clean), forward(corrupted)
    m_circuit, _ = forward(clean, patched=corrupted_run)
    assert measured == pytest.approx((m_circuit - m_corrupted) / (m_clean - m_corrupted), abs=1e-9)
    assert abs(measured - empty) > 0.05  # the edge carries something


def test_the_planted_edge_makes_a_small_circuit_faithful():
    """Planted GPT-2: the smallest top-k EAP circuit holding A → B.q keeps most of the behaviour; the same circuit
    with A → B.q swapped for the next edge keeps far less."""
    handle, clean, corrupted, metric = planted("gpt2")
    scores = _scored(handle, clean, corrupted, metric)
    planted_edge = Edge(A, (*B, "q"))
    k = next(k for k in range(1, len(scores)) if planted_edge in top_edges(scores, k=k))
    assert k <= 4
    kept = top_edges(scores, k=k)
    swapped = Circuit("eap", [e for e in kept.edges if e != planted_edge] + [top_edges(scores, k=k + 1).edges[-1]],
                      np.zeros(k))
    with_it, without = (faithfulness(handle, clean, corrupted, metric, c) for c in (kept, swapped))
    assert with_it > 0.7 and without < 0.5 and with_it - without > 0.3, (with_it, without)


def test_one_extra_attention_call_per_distinct_own_stream(monkeypatch):
    handle, clean, corrupted, metric = random_pair("gpt2")
    scores = _scored(handle, clean, corrupted, metric)
    calls = []
    extra = inputs._inputs_from  # the extra call of own_inputs: a receiver's q, k, v from its own stream
    monkeypatch.setattr(inputs, "_inputs_from", lambda site, *args: calls.append(site.layer) or extra(site, *args))
    faithfulness(handle, clean, corrupted, metric, top_edges(scores, k=len(scores)))
    assert calls == []  # every edge: every receiver reads the stream as it is
    # two receivers of layer 1 keep one edge each; every other receiver misses every sender
    circuit = Circuit("", [Edge((0, 1), (1, 2, "q")), Edge((0, 3), (1, 0, "v"))], np.ones(2))
    faithfulness(handle, clean, corrupted, metric, circuit)
    assert calls == [0, 1, 1, 1]  # layer 0: one stream (all miss the input); layer 1: three distinct streams


def test_the_path_method_scores_every_edge():
    handle, clean, corrupted, metric = random_pair("gpt2")
    seen = []
    scores = score_edges(handle, clean, corrupted, metric, method="path", progress=lambda d, t: seen.append((d, t)))
    edges = graph_edges(handle)
    assert scores.edges == edges and scores.method == "path patching"
    assert scores.details == {"direction": "denoise", "input edges": "edge patching"}
    inputs = [e for e in edges if e.sender == INPUT]
    by_edge = edge_patching(handle, clean, corrupted, metric, edges=inputs)
    assert [scores[e] for e in inputs] == pytest.approx(list(by_edge.scores), abs=1e-12)
    some = [Edge((0, 2), (1, 1, "k")), Edge((1, 3), OUTPUT)]
    by_path = path_patching(handle, clean, corrupted, metric, receivers=[(1, 1, "k"), OUTPUT], senders=[(0, 2), (1, 3)])
    assert [scores[e] for e in some] == pytest.approx([by_path[e] for e in some], abs=1e-12)
    assert seen[-1] == (scores.forwards - 4, scores.forwards - 4)  # every forward but the two methods' clean/corrupted
    with pytest.raises(ValueError, match=r"method='acdc'; expected one of \('eap', 'eap-ig', 'path', 'exact'\)"):
        score_edges(handle, clean, corrupted, metric, method="acdc")


def test_top_edges_by_magnitude_and_bad_arguments():
    edges = [Edge(INPUT, (0, h, "q")) for h in range(4)]
    scores = EdgeScores("eap", edges, np.array([0.1, -0.5, 0.3, -0.3]), 1.0, 0.0, 3, 1, 0.1)
    assert top_edges(scores, k=3).edges == [edges[1], edges[2], edges[3]]  # a tie keeps the scores' order
    assert list(top_edges(scores, k=2).scores) == [-0.5, 0.3]
    assert top_edges(scores, threshold=0.3).edges == [edges[1], edges[2], edges[3]]
    assert len(top_edges(scores, k=0)) == 0 and len(top_edges(scores, k=10)) == 4
    assert len(top_edges(scores, k=np.int64(2))) == 2 and len(top_edges(scores, threshold=np.float32(0.2))) == 3
    for kwargs, message in [({}, "exactly one of k and threshold"), ({"k": 2, "threshold": 0.1}, "exactly one"),
                            ({"k": -1}, r"k=-1; expected an int ≥ 0"), ({"k": 1.5}, r"k=1.5; expected"),
                            ({"threshold": -0.1}, r"threshold=-0.1; expected a finite number ≥ 0"),
                            ({"threshold": float("nan")}, "threshold=nan")]:
        with pytest.raises(ValueError, match=message):
            top_edges(scores, **kwargs)
    with pytest.raises(ValueError, match="each edge once"):
        Circuit("", [edges[0], edges[0]], np.ones(2))
    with pytest.raises(ValueError, match="1 scores for 2 edges"):
        Circuit("", edges[:2], np.ones(1))


def test_an_edge_the_model_does_not_have_is_refused():
    handle, clean, corrupted, metric = random_pair("gpt2")
    with pytest.raises(ValueError, match=r"L1 H0 → L0 H1.q.* not edges of this model"):
        faithfulness(handle, clean, corrupted, metric, Circuit("", [Edge((1, 0), (0, 1, "q"))], np.ones(1)))


def test_the_curve_rises_from_the_empty_circuit_to_the_whole_graph(tmp_path):
    handle, clean, corrupted, metric = planted("gpt2")
    scores = _scored(handle, clean, corrupted, metric)
    seen = []
    curve = faithfulness_curve(handle, clean, corrupted, metric, scores, progress=lambda d, t: seen.append((d, t)))
    assert curve.sizes[0] == 0 and curve.sizes[-1] == len(scores) and curve.sizes == sorted(set(curve.sizes))
    assert curve.faithfulness[0] == pytest.approx(0, abs=1e-6) and curve.faithfulness[-1] == pytest.approx(1, abs=1e-6)
    assert seen[-1] == (len(curve.sizes), len(curve.sizes)) and curve.forwards == 2 + len(curve.sizes)
    assert curve.smallest(0.7) is not None and curve.smallest(0.7) <= 6
    assert json.loads(json.dumps(curve.to_dict()))["points"][0] == {"size": 0, "faithfulness": curve.faithfulness[0],
                                                                     "metric": curve.metrics[0]}
    assert repr(curve).startswith("FaithfulnessCurve: eap, ") and len(repr(curve).splitlines()) == 4
    assert plot_faithfulness(curve, tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    few = faithfulness_curve(handle, clean, corrupted, metric, scores, sizes=[3, 1, 3])
    assert few.sizes == [1, 3]
    with pytest.raises(ValueError, match=r"sizes=\[82\]; expected one or more ints from 0 to 81"):
        faithfulness_curve(handle, clean, corrupted, metric, scores, sizes=[82])


def test_a_circuit_writes_its_files_and_shows_short(tmp_path):
    handle, clean, corrupted, metric = _attention_only()
    scores = _scored(handle, clean, corrupted, metric)
    circuit = top_edges(scores, k=6)
    faithfulness(handle, clean, corrupted, metric, circuit)
    paths = circuit.write(tmp_path)
    assert [p.name for p in paths] == ["circuit.json", "circuit.csv", "circuit.png", "circuit.svg"]
    document = json.loads((tmp_path / "circuit.json").read_text())
    assert document["size"] == 6 and document["scored"] == len(scores) and document["method"] == "eap"
    assert document["faithfulness"] == circuit.faithfulness and document["heads"] == [[4, 4], [2, 2], [4, 2]]
    assert [e["score"] for e in document["edges"]] == list(circuit.scores)
    rows = (tmp_path / "circuit.csv").read_text().splitlines()
    assert rows[0] == "sender,receiver,role,score" and len(rows) == 7
    assert (tmp_path / "circuit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ET.parse(tmp_path / "circuit.svg").getroot().tag.endswith("svg")
    text = repr(circuit)
    assert text.startswith(f"Circuit: 6 edges of {len(scores)} (eap)") and len(text.splitlines()) == 4
    assert "<table" in circuit._repr_html_()
    with pytest.raises(ValueError, match=r"'circuit.pdf': expected a file name ending in .png or .svg"):
        plot_circuit(circuit, "circuit.pdf")


def test_the_figure_draws_grouped_query_heads_and_an_empty_circuit(tmp_path):
    handle, clean, corrupted, metric = random_pair("llama")
    scores = _scored(handle, clean, corrupted, metric)
    assert top_edges(scores, k=1).heads == [(4, 2), (4, 2)]
    assert plot_circuit(top_edges(scores, k=40), tmp_path / "llama.svg").stat().st_size > 1000
    assert plot_circuit(top_edges(scores, k=0), tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"
