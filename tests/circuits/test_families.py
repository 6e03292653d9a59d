"""Circuits on models of one residual stream beyond the text decoders (headlab.circuits on ViT, CLIP's vision
tower, ALBERT), against references written with hooks on transformers' own modules (tests/support/circuits.py),
float64:

- edge patching of one edge (into a q, k, v, or the output) equals the reference;
- EAP's score of an edge is the slope of the reference at zero; one step of EAP-IG is that slope with the stream the
  input enters with halfway between the runs' (a vision model's patches, ALBERT's embeddings mapped in);
- path patching of a head → head path equals the reference, also across an encoder-decoder's two streams (BART:
  an encoder head into a cross-attention head's k and v);
- a circuit of every edge is the clean run (faithfulness 1);
- a model without one residual stream (Swin's stages and windows) and direct logit attribution without logits are
  refused in one line naming why (an encoder-decoder's two streams are served: tests/circuits/test_seq2seq_edges.py);
- an encoder-decoder's composition scores follow its two streams, and its direct logit attribution is its
  decoder's heads.
"""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab.circuits import direct_logit_attribution
from headlab.circuits.circuit import faithfulness, top_edges
from headlab.circuits.edges import edge_attribution, edge_patching
from headlab.circuits.graph import OUTPUT, Edge
from headlab.circuits.paths import path_patching
from tests.support.circuits import FAMILY_PAIRS, edge_reference, entering, family_pair, path_reference
from tests.support.families import FAMILIES

EDGES = [Edge((0, 1), (1, 2, "q")), Edge((0, 3), (1, 0, "k")), Edge((0, 2), (1, 1, "v")), Edge((1, 2), OUTPUT)]
STEP = 1e-4  # the finite differences' step: float64 keeps them to about 1e-8


def _slope(name, clean, corrupted, metric, edge, **entry):
    receiver = "output" if edge.receiver == OUTPUT else edge.receiver
    ahead, behind = (edge_reference(name, clean, corrupted, metric, edge.sender, receiver, scale=s, **entry)
                     for s in (STEP, -STEP))
    return (ahead - behind) / (2 * STEP)


@pytest.mark.parametrize("name", FAMILY_PAIRS)
def test_edge_patching_equals_a_reference_by_hooks(name):
    handle, clean, corrupted, metric = family_pair(name)
    scores = edge_patching(handle, clean, corrupted, metric, edges=EDGES)
    for edge in EDGES:
        receiver = "output" if edge.receiver == OUTPUT else edge.receiver
        expected = edge_reference(name, clean, corrupted, metric, edge.sender, receiver)
        assert abs(expected) > 1e-8, edge.label  # the edge carries something
        assert scores[edge] == pytest.approx(expected, rel=1e-8, abs=1e-12), edge.label


@pytest.mark.parametrize("name", FAMILY_PAIRS)
def test_eap_is_the_slope_of_the_reference(name):
    handle, clean, corrupted, metric = family_pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric)
    assert len(scores) == len(headlab.circuits.graph_edges(handle))
    for edge in EDGES:
        assert scores[edge] == pytest.approx(_slope(name, clean, corrupted, metric, edge), rel=1e-5, abs=1e-9), \
            edge.label


@pytest.mark.parametrize("name", FAMILY_PAIRS)
def test_one_step_of_eap_ig_is_the_slope_where_the_input_enters_halfway(name):
    handle, clean, corrupted, metric = family_pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=1)
    halfway = (entering(name, clean) + entering(name, corrupted)) / 2
    edge = EDGES[1]
    slope = _slope(name, clean, corrupted, metric, edge, entry=halfway)
    assert scores[edge] == pytest.approx(slope, rel=1e-5, abs=1e-9)
    assert slope != pytest.approx(_slope(name, clean, corrupted, metric, edge), rel=1e-3)  # the midpoint matters


@pytest.mark.parametrize("name", FAMILY_PAIRS)
@pytest.mark.parametrize("receiver", [(1, 2, "q"), (1, 0, "k"), (1, 3, "v")])
def test_a_path_equals_a_reference_by_hooks(name, receiver):
    handle, clean, corrupted, metric = family_pair(name)
    scores = path_patching(handle, clean, corrupted, metric, receivers=[receiver], senders=[(0, 1)])
    expected = path_reference(name, clean, corrupted, metric, (0, 1), receiver)
    assert scores[Edge((0, 1), receiver)] == pytest.approx(expected, rel=1e-8, abs=1e-12)


@pytest.mark.parametrize(("sender", "receiver"), [((0, 1), (3, 2, "k")), ((1, 3), (5, 0, "v")),
                                                   ((3, 1), (5, 1, "q")), ((3, 2), (4, 1, "k"))])
def test_an_encoder_decoder_path_equals_a_reference_by_hooks(sender, receiver):
    """Across BART's two streams: an encoder head into a cross-attention head's k or v, a decoder head into a later
    decoder head (layers: encoder 0, 1; decoder self 2, 4, cross 3, 5)."""
    handle, clean, corrupted, metric = family_pair("bart")
    scores = path_patching(handle, clean, corrupted, metric, receivers=[receiver], senders=[sender])
    expected = path_reference("bart", clean, corrupted, metric, sender, receiver)
    assert abs(expected) > 1e-10
    assert scores[Edge(sender, receiver)] == pytest.approx(expected, rel=1e-8, abs=1e-12)


def test_an_encoder_decoder_has_paths_along_its_streams_only():
    handle, clean, corrupted, metric = family_pair("bart")
    scores = path_patching(handle, clean, corrupted, metric, receivers=[(2, 0, "q"), (3, 0, "q"), (3, 0, "k"), OUTPUT],
                           senders=[(0, 0), (2, 1)])
    assert {edge.label for edge in scores.edges} == {"L0 H0 → L3 H0.k", "L2 H1 → L3 H0.q", "L2 H1 → output"}


@pytest.mark.parametrize("name", FAMILY_PAIRS)
def test_a_circuit_of_every_edge_is_the_clean_run(name):
    handle, clean, corrupted, metric = family_pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric)
    assert faithfulness(handle, clean, corrupted, metric, top_edges(scores, k=len(scores))) == pytest.approx(
        1, abs=1e-6)


def test_a_model_without_one_stream_is_refused_in_one_line():
    swin = headlab.attach(FAMILIES["swin"].build(dtype=torch.float64))
    pixels = torch.randn(1, 3, 16, 16, dtype=torch.float64)

    def metric(output):
        return output.last_hidden_state.sum()

    with pytest.raises(ValueError, match=r"^SwinModel: its layers read streams of different shapes .* no single "
                                         r"residual stream"):
        edge_attribution(swin, {"pixel_values": pixels}, {"pixel_values": pixels * 0.5}, metric)


def test_logit_attribution_on_a_vision_model_says_it_has_no_logits():
    handle, clean, _, _ = family_pair("vit")
    with pytest.raises(ValueError, match=r"^ViTModel: direct logit attribution needs logits: .*no unembedding"):
        direct_logit_attribution(handle, clean, (5, 7))


def _seq2seq_lm(name: str):
    import transformers

    config = FAMILIES[name].config()
    torch.manual_seed(0)
    model_class = {"bart": transformers.BartForConditionalGeneration, "t5": transformers.T5ForConditionalGeneration}
    handle = headlab.attach(model_class[name]._from_config(config).double().eval())
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    return handle, {"input_ids": ids, "decoder_input_ids": ids[:, :4]}


def test_composition_of_an_encoder_decoder_follows_its_two_streams():
    """Encoder heads K- and V-compose with every cross-attention head, never with the decoder's self-attention; a
    cross-attention head's q reads the decoder (layers: encoder 0, 1; decoder self 2, 4; cross 3, 5)."""
    import numpy as np

    from headlab.circuits import composition_scores

    handle, _ = _seq2seq_lm("bart")
    scores = composition_scores(handle, samples=2)

    def pairs(kind):
        found = ~np.isnan(scores.scores[kind][:, 0, :, 0])
        return {(int(i), int(j)) for i, j in zip(*np.nonzero(found))}

    assert pairs("q") == {(0, 1), (2, 3), (2, 4), (2, 5), (3, 4), (3, 5), (4, 5)}
    assert pairs("k") == pairs("v") == {(0, 1), (0, 3), (0, 5), (1, 3), (1, 5), (2, 4), (3, 4)}


def test_logit_attribution_of_an_encoder_decoder_is_its_decoders():
    handle, inputs = _seq2seq_lm("bart")
    result = direct_logit_attribution(handle, inputs, (5, 7))
    assert {layer for layer, _ in result.heads} == {2, 3, 4, 5} and result.length == 4
    assert result.error < 1e-9  # the parts sum to the logit difference
    with pytest.raises(ValueError, match=r"^layers \[0\] write the encoder's stream, .* no direct path"):
        direct_logit_attribution(handle, inputs, (5, 7), heads={0: [1]})
    t5, inputs = _seq2seq_lm("t5")
    with pytest.raises(ValueError, match=r"^T5ForConditionalGeneration: no norm makes what its unembedding \(lm_head\) "
                                         r"reads"):
        direct_logit_attribution(t5, inputs, (5, 7))
