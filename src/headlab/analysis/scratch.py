"""A reusable buffer for an accumulator's large temporaries.

Freshly allocated large tensors are returned to the operating system when freed, so every
batch's temporaries would be page-faulted in again: on the 2-core CI machine that costs about
as much as the arithmetic done in them (≈17 ms per 50 MB). An accumulator keeps one ``Scratch``
and takes its temporaries from it; the buffer grows to the largest request and is reused. A
``Scratch`` is pickled empty (an accumulator shipped to another process carries its sums, not its
temporaries).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Scratch"]


class Scratch:
    """One growing buffer per (dtype, device), handed out as views of the requested shape."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device, int], Tensor] = {}

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its buffers."""
        return {"_buffers": {}}

    def take(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device, slot: int = 0) -> Tensor:
        """An uninitialised contiguous tensor of ``shape``; valid until the next ``take`` of the same slot.

        Args:
            shape: the tensor's shape.
            dtype, device: of the tensor.
            slot: requests with different slots get non-overlapping memory.
        """
        numel = math.prod(shape)
        key = (dtype, torch.device(device), slot)
        held = self._buffers.get(key)
        if held is None or held.numel() < numel:
            held = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = held
        return held[:numel].view(shape)
