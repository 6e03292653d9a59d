"""Heads together: how the heads of a model work as circuits.

    graph.py        the edges between heads (sender head → receiver head's q, k or v; → the output)
                    and their scores
    logit.py        direct logit attribution: each head's output carried to the logits
    composition.py  Q-, K- and V-composition scores between heads, from their weights
    runs.py         the clean and corrupted runs every method starts from
    inputs.py       a receiver's q, k, v computed from a stream of its own, by the model's modules
    gradients.py    the gradient reaching the stream through one receiver's input (EAP's products)
    paths.py        path patching: senders' effect on receivers' inputs, other heads frozen
    edges.py        edge attribution (EAP, EAP-IG) and exact edge patching
    circuit.py      a circuit (the top edges), its faithfulness by forwards, the faithfulness curve
    _figure.py      the circuit's graph figure and the curve's plot

Every function takes what ``headlab.run_with_cache`` takes: a ``HeadedModel`` (or an attached
model) and inputs. Per-position activation patching lives with the per-head kind, in
``headlab.analysis`` (``activation_patching(..., positions="each")``).
"""

from headlab.circuits.circuit import (
    SCORING,
    Circuit,
    FaithfulnessCurve,
    faithfulness,
    faithfulness_curve,
    plot_circuit,
    plot_faithfulness,
    score_edges,
    top_edges,
)
from headlab.circuits.composition import CompositionScores, composition_scores, plot_composition
from headlab.circuits.edges import edge_attribution, edge_patching
from headlab.circuits.graph import INPUT, OUTPUT, Edge, EdgeScores, graph_edges
from headlab.circuits.logit import LogitAttribution, direct_logit_attribution, plot_logit_attribution
from headlab.circuits.paths import path_patching

__all__ = ["INPUT", "OUTPUT", "SCORING", "Circuit", "CompositionScores", "Edge", "EdgeScores", "FaithfulnessCurve",
           "LogitAttribution", "composition_scores", "direct_logit_attribution", "edge_attribution", "edge_patching",
           "faithfulness", "faithfulness_curve", "graph_edges", "path_patching", "plot_circuit", "plot_composition",
           "plot_faithfulness", "plot_logit_attribution", "score_edges", "top_edges"]
