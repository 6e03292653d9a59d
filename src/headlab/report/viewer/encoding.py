"""Compact encodings of attention patterns for the browser, and JSON that is safe inside ``<script>``.

Axis legend:
    pattern   (query_pos, key_pos)   one head, one item; rows sum to 1 (or 0 for a fully masked row); n × m, square
                                     but for an encoder-decoder's cross-attention (target × source positions)
    codes     (query_pos, key_pos)   uint8
    scale     (query_pos,)           float32, the row's largest weight

A pattern is sent as one byte per entry, relative to its row's largest weight:
``codes[i, j] = round(255 · p[i, j] / scale[i])``, so the browser reads back
``p[i, j] ≈ codes[i, j] · scale[i] / 255`` within ``scale[i] / 510``. Rows are compared within a
row, which is what a highlight shows, and a sharp head keeps its small weights as well as a broad
head keeps its uniform ones. The codes are deflated (zlib): causal patterns' upper triangle and the
near-zero tails of sharp heads cost almost nothing. The browser inflates them with the built-in
``DecompressionStream("deflate")``, so no library is needed.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from headlab.capture.words import pattern_to_words

__all__ = ["QuantizedPattern", "THUMBNAIL_SIZE", "quantize", "script_json", "thumbnails"]

THUMBNAIL_SIZE = 48  # most cells per side of a head's thumbnail
_LEVEL = 1  # zlib's fastest level: within a few percent of level 6 on patterns, several times faster


@dataclass(frozen=True)
class QuantizedPattern:
    """One head's pattern on one item as row-relative bytes, deflated.

    Attributes:
        n, m: query and key positions (the pattern is n × m).
        scale: ``(n,)`` float32, each row's largest weight.
        deflated: zlib-compressed ``(n, m)`` uint8 codes, row-major.
    """

    n: int
    m: int
    scale: np.ndarray
    deflated: bytes

    def codes(self) -> np.ndarray:
        """Returns: ``(n, m)`` uint8 codes."""
        return np.frombuffer(zlib.decompress(self.deflated), dtype=np.uint8).reshape(self.n, self.m)

    def values(self) -> np.ndarray:
        """Returns: ``(n, m)`` float32, the weights the browser reads back (within ``scale / 510``)."""
        return self.codes().astype(np.float32) * (self.scale[:, None] / np.float32(255.0))

    @property
    def nbytes(self) -> int:
        """Bytes sent: the deflated codes and the scales."""
        return len(self.deflated) + self.scale.nbytes

    def to_dict(self) -> dict[str, Any]:
        """Returns: ``{"n", "m", "scale", "codes"}`` with base64 strings (little-endian float32; zlib bytes)."""
        return {"n": self.n, "m": self.m, "scale": _b64(self.scale.astype("<f4").tobytes()),
                "codes": _b64(self.deflated)}


def quantize(pattern: Tensor) -> QuantizedPattern:
    """Encode one ``(n, m)`` pattern row by row (see the module docstring).

    Args:
        pattern: ``(n, m)`` non-negative weights, finite.

    Returns:
        The encoded pattern.

    Raises:
        ValueError: the pattern is not a matrix, or holds a negative or non-finite weight.
    """
    if pattern.dim() != 2:
        raise ValueError(f"pattern has shape {tuple(pattern.shape)}; expected (n, m)")
    p = pattern.detach().to(torch.float32).cpu()
    low, high = torch.aminmax(p)
    if not (bool(torch.isfinite(high)) and float(low) >= 0):  # NaN fails both tests
        raise ValueError(f"pattern holds weights in [{float(low)}, {float(high)}]; "
                         "attention weights are finite and ≥ 0")
    scale = p.amax(dim=1)
    codes = (p * (255.0 / scale.clamp(min=1e-30))[:, None]).round_().clamp_(0, 255).to(torch.uint8)
    return QuantizedPattern(n=p.shape[0], m=p.shape[1], scale=scale.numpy(),
                            deflated=zlib.compress(codes.numpy().tobytes(), _LEVEL))


def thumbnails(patterns: Tensor | list[Tensor], *, size: int = THUMBNAIL_SIZE) -> tuple[int, bytes]:
    """Pool each head's pattern to at most ``size × size`` cells and scale each head to its maximum.

    Pooling treats runs of consecutive positions as one unit, the way words pool pieces
    (``headlab.capture.words.pattern_to_words``: sum over keys, mean over queries), so a pooled
    row still sums to 1. Heads of different shapes (an encoder-decoder's sites) are each averaged onto one
    ``t × t`` grid (``adaptive_avg_pool2d``: a side shorter than ``t`` is stretched), what a thumbnail can show.

    Args:
        patterns: ``(head, n, n)``, or a list of ``(n, m)`` patterns, one per head, of any sizes.
        size: most cells per side.

    Returns:
        ``(t, deflated)``: the side ``t = min(n, size)`` (the longest side of all, for a list) and zlib-compressed
        ``(head, t, t)`` uint8, 255 at each head's largest pooled cell.

    Raises:
        ValueError: a tensor that is not ``(head, n, n)``.
    """
    if isinstance(patterns, list):
        t = min(size, max(max(p.shape) for p in patterns))
        pooled = torch.stack([F.adaptive_avg_pool2d(p.detach().float().cpu()[None], (t, t))[0] for p in patterns])
        return t, _codes(pooled)
    if patterns.dim() != 3 or patterns.shape[-1] != patterns.shape[-2]:
        raise ValueError(f"patterns have shape {tuple(patterns.shape)}; expected (head, n, n)")
    n = patterns.shape[-1]
    t = min(n, size)
    units = torch.arange(n) * t // n
    return t, _codes(pattern_to_words(patterns.detach().float().cpu(), units, n_units=t))  # (head, t, t)


def _codes(pooled: Tensor) -> bytes:
    """``(head, t, t)`` pooled patterns as deflated uint8, each head scaled to 255 at its largest cell."""
    peak = pooled.flatten(1).amax(1).clamp(min=1e-30)[:, None, None]
    codes = torch.round(pooled * 255.0 / peak).clamp(0, 255).to(torch.uint8)
    return zlib.compress(codes.numpy().tobytes(), _LEVEL)


def script_json(value: Any) -> str:
    """JSON text that can sit inside ``<script type="application/json">`` unchanged.

    ``<``, ``>`` and ``&`` become ``\\u003c``, ``\\u003e``, ``\\u0026`` (so neither ``</script>`` nor
    ``<!--`` can appear), and U+2028/U+2029 are escaped too; ``JSON.parse`` gives back the same
    strings. Non-finite floats are refused rather than written as invalid JSON.

    Raises:
        ValueError: the value holds NaN or infinity.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
