"""Key/value cache for incremental (token by token) decoding.

Axis legend: keys ``(batch, n_kv_heads, key_pos, d_head)``, values
``(batch, n_kv_heads, key_pos, d_head_v)``. Keys are stored after the rotary embedding, so
a cached key never needs re-rotating.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys and values of the positions seen so far.

    Args:
        batch_size: sequences decoded together.
        max_len: most positions the cache can hold.
        n_kv_heads, d_head, d_head_v: the layer's sizes.
        dtype, device: of the stored keys and values.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        max_len: int,
        n_kv_heads: int,
        d_head: int,
        d_head_v: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        sizes = dict(batch_size=batch_size, max_len=max_len, n_kv_heads=n_kv_heads, d_head=d_head, d_head_v=d_head_v)
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        self.max_len = max_len
        self.keys = torch.zeros(batch_size, n_kv_heads, max_len, d_head, dtype=dtype, device=device)
        self.values = torch.zeros(batch_size, n_kv_heads, max_len, d_head_v, dtype=dtype, device=device)
        self.length = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append new keys and values; return all of them so far (views, no copy).

        Args:
            k: ``(batch, n_kv_heads, new_pos, d_head)``.
            v: ``(batch, n_kv_heads, new_pos, d_head_v)``.

        Returns:
            ``(keys, values)`` over positions ``0 .. length`` after the update.

        Raises:
            ValueError: the shapes do not match the cache, or it would overflow.
        """
        keys, values = self.keys, self.values
        if (
            k.shape[:2] != keys.shape[:2] or k.shape[3:] != keys.shape[3:]
            or v.shape[:2] != values.shape[:2] or v.shape[3:] != values.shape[3:] or v.shape[2] != k.shape[2]
        ):
            raise ValueError(
                f"kv_cache holds keys {tuple(keys.shape)} and values {tuple(values.shape)} "
                f"(batch, n_kv_heads, max_len, d); got new keys {tuple(k.shape)} and values {tuple(v.shape)}"
            )
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"kv_cache overflow: {self.length} cached + {k.shape[2]} new positions > max_len={self.max_len}"
            )
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def reset(self) -> None:
        """Forget every position (the buffers are kept)."""
        self.length = 0
