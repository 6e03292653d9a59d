"""Black-box audit of any attention module: what it is, from the running module alone.

``audit(module)`` runs the module on probe inputs while a ``TorchFunctionMode`` intercepts the
attention it computes (softmax, ``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``'s
functional path), recovers each head's W_QK and W_OV exactly by probing with basis inputs, and
reports heads, head size, what each head reads, sharing, key/value groups, causality, parameter
counts and the equivalent headlab layer, verified by equal outputs. No source text and no
attribute name is read. ``load_module("PATH.py:ClassName")`` builds a module from a user's file
(the file is executed). The examples/ subpackage holds the attention layers the tests audit.

Rooms: ``intercept`` (the mode), ``lineage`` (what depends on the inputs, and the steps on its
way), ``calling`` (conventions and their detection), ``probes`` (the maps, from basis inputs),
``checks`` (measurements on random inputs), ``masks`` (masks and causal flags of the forward),
``structure`` (linear algebra on the recovered maps), ``equivalence`` (the headlab layer),
``findings`` (measurements → result), ``verdict`` (result and sentences), ``tables`` (evidence
tables), ``loading`` (user files, constructor arguments, factories), ``run``.
"""

from headlab.audit.calling import CONVENTIONS
from headlab.audit.errors import AuditError
from headlab.audit.loading import LoadError, load_module
from headlab.audit.run import audit
from headlab.audit.verdict import AuditResult, Equivalence, Evidence, ForwardOptions, HeadEvidence, Parameters

__all__ = [
    "CONVENTIONS", "AuditError", "AuditResult", "Equivalence", "Evidence", "ForwardOptions", "HeadEvidence",
    "LoadError", "Parameters", "audit", "load_module",
]
