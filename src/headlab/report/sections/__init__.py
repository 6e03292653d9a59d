"""The sections of ``headlab report``, grouped into parts, in page order.

One part per question about heads, each titled with its question and holding the sections that
measure its answer (do heads share Q/K/V weights? do more heads mean more parameters? why separate
W_Q and W_K? is 8-head attention 1-head attention with the same weights? what makes heads differ?),
then the model's heads (analysis, patching, viewer), then correctness and speed. To add a
section: write ``sections/<name>.py`` exposing ``SECTION`` (a
:class:`headlab.report.section.Section`) and put it in the part it answers.
"""

from __future__ import annotations

from headlab.report.section import Part, Section
from headlab.report.sections import (
    analysis,
    audit,
    bench,
    circuits,
    experiments,
    params,
    parity,
    patching,
    qk,
    sinks,
    streaming,
    viewer,
)

__all__ = ["DEFAULT_SECTIONS"]

DEFAULT_SECTIONS: list[Section | Part] = [
    Part(
        "shared-weights", "Do the heads share their query, key and value weights?",
        "A widely copied tutorial layer cuts the input into one slice per head and sends every slice through "
        "the same small projection. In the standard layer each head has its own slice of every projection "
        "and reads the whole input. Which is which can be told from what the running module computes.",
        sections=(audit.SECTION,), see_also=("params",),
    ),
    Part(
        "more-heads", "Do more heads mean more parameters, or different outputs?",
        "torch.nn.MultiheadAttention has as many parameters with one head as with sixteen. Below: the count "
        "against the number of heads for every variant and why it moves or does not, then what the number of "
        "heads does to a small trained model's accuracy.",
        sections=(params.SECTION, experiments.HEADS_COUNT), see_also=("experiment-heads-vs-one",),
    ),
    Part(
        "separate-qk", "Why keep W_Q and W_K apart instead of learning one W_QK?",
        "A head's scores are x W_Q (x W_K)ᵀ = x W_QK xᵀ. One full W_QK per head is a bilinear form that "
        "could be learned directly; the two factors are cheaper but cap its rank at d_head. Below: the rank "
        "of W_QK measured in the report's model and what each form costs; a bilinear layer trained beside the "
        "others is in the variants experiment.",
        sections=(qk.SECTION,), see_also=("params", "experiment-variants"),
    ),
    Part(
        "heads-vs-one-head", "Is 8-head attention the same tensor as 1-head attention with the same weights?",
        "The same projections can be read as eight heads of width d_model/8 or one head of width d_model. "
        "The softmax is taken per head; below, the difference between the two readings against the scale of "
        "the logits, in the outputs and in the gradients.",
        sections=(experiments.HEADS_VS_ONE,),
    ),
    Part(
        "different-heads", "What makes each head learn something different?",
        "Every head of a layer is built the same way. Below: what gradient descent does with heads that start "
        "identical, layer variants trained side by side, and a previous-token head and an induction head "
        "forming during training; then what the heads of the report's model do by the measures of 2020–2025: "
        "where attention lands and what it carries (sinks, value-weighted attention), which heads copy from far "
        "back and which could keep only a window of keys. The classic surface statistics are in the analysis.",
        sections=(experiments.SYMMETRY, experiments.VARIANTS, experiments.INDUCTION, sinks.SECTION, streaming.SECTION),
        see_also=("analysis", "circuits"),
    ),
    Part(
        "heads", "The heads of the report's model",
        "Roles, pattern classes, similarity, importance, pruning and syntax over the corpus; which heads carry "
        "one behaviour, by exact and attribution patching; how heads work together, in the induction experiment's "
        "model and in this one; then every head of the model in an interactive viewer.",
        sections=(analysis.SECTION, patching.SECTION, circuits.SECTION, viewer.SECTION),
    ),
    Part(
        "checks", "Correctness and speed",
        "headlab's layer against torch.nn.MultiheadAttention on the same weights and inputs, then the latest "
        "benchmark of headlab against its peers.",
        sections=(parity.SECTION, bench.SECTION),
    ),
]
