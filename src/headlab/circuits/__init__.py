"""Heads together: how the heads of a model work as circuits.

    graph.py        the edges between heads (sender head → receiver head's q, k or v; → the output)
                    and their scores
    logit.py        direct logit attribution: each head's output carried to the logits
    composition.py  Q-, K- and V-composition scores between heads, from their weights
    inputs.py       a receiver's q, k, v computed from a stream of its own, by the model's modules
    paths.py        path patching: senders' effect on receivers' inputs, other heads frozen
    edges.py        edge attribution (EAP, EAP-IG) and exact edge patching
    circuit.py      a circuit (the top edges), its faithfulness and its figure

Every function takes what ``headlab.run_with_cache`` takes: a ``HeadedModel`` (or an attached
model) and inputs.
"""
