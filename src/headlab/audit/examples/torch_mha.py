"""``torch.nn.MultiheadAttention`` itself, for ``headlab audit`` to audit as it audits any layer.

It has no default sizes, so pass them: ``headlab audit src/headlab/audit/examples/torch_mha.py:
MultiheadAttention --init '{"embed_dim": 64, "num_heads": 8}'``. Its default ``batch_first=False``
takes ``(pos, batch, embed_dim)`` inputs, which the audit detects; it is called as
``forward(query, key, value)`` and returns ``(output, weights)``.
"""

from __future__ import annotations

from torch.nn import MultiheadAttention

__all__ = ["MultiheadAttention"]
