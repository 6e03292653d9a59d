"""The one error an audit raises about the audited module itself."""

from __future__ import annotations

__all__ = ["AuditError", "FAILURE_KINDS"]

FAILURE_KINDS = ("raised", "no-attention", "wrong-output", "several-attention", "unsupported")
"""Why a module could not be audited:

raised: its constructor or forward raised.
no-attention: it ran but computed no softmax, scaled_dot_product_attention or
    multi_head_attention_forward over the probe positions.
wrong-output: it returned something other than a tensor shaped like its query input.
several-attention: one forward computed stacked attention layers (a later attention call reads
    what an earlier one computed); calls that are one layer's heads are not this.
unsupported: it uses an attention option the audit cannot follow (named in the message).
"""


class AuditError(RuntimeError):
    """The audited module cannot be audited; the message says why in plain words.

    Attributes:
        kind: one of ``FAILURE_KINDS``.
    """

    def __init__(self, kind: str, message: str) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind={kind!r} is not one of {FAILURE_KINDS}")
        super().__init__(message)
        self.kind = kind
