"""The options a forward takes that users of nn.MultiheadAttention ask about: masks and a causal flag.

- ``find_mask``: where and in which form the module takes a mask. Each candidate (a keyword
  below, or the fourth argument of ``forward(values, keys, query, mask)``; shaped
  ``(query_pos, key_pos)`` or ``(batch, key_pos)``; in one of the four forms of ``MASK_FORMS``)
  hides the last key from every query of a random input; the candidate whose intercepted
  pattern gives that key exactly zero weight, and every key the unmasked pattern weighs a
  positive weight, is the mask.
- ``masked_row``: with that mask hiding every key from one query (every query, for a
  ``(batch, key_pos)`` mask), what the module itself returns there, nothing intercepted: NaN,
  no attention (the output bias alone), or an attention over the hidden keys.
- ``causal_flag``: a causal flag (``is_causal=True``, ``causal=True``), passed with an all-allowed
  mask where the module wants one (nn.MultiheadAttention does), with weights not requested and
  requested (``need_weights`` and the like, a keyword that adds a tensor to what it returns):
  the output changes before the last position when only the last input changes, or not.

Axis legend: x ``(pos, d_model)``; masks ``(query_pos, key_pos)`` or ``(batch, key_pos)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from headlab.audit.checks import causal_changes
from headlab.audit.errors import AuditError
from headlab.audit.probes import Prober

__all__ = ["CAUSAL_FLAGS", "CausalFlag", "MASK_FORMS", "MASK_KEYWORDS", "MaskForm", "WEIGHT_KEYWORDS", "causal_flag",
           "find_mask", "masked_row"]

MASK_KEYWORDS = ("attn_mask", "mask", "attention_mask", "key_padding_mask", "src_key_padding_mask")
CAUSAL_FLAGS = ("is_causal", "causal")
WEIGHT_KEYWORDS = ("need_weights", "output_attentions", "return_attention_weights", "return_weights",
                   "return_attention")
_LENGTH = 6  # positions of the mask probes
_ZERO = 1e-12  # attention weight that counts as none

# hidden (bool, True = hide) → the mask in each form, in the probe dtype
MASK_FORMS: dict[str, Callable[[Tensor, torch.dtype], Tensor]] = {
    "bool, True = not allowed": lambda hidden, dtype: hidden,
    "bool, True = allowed": lambda hidden, dtype: ~hidden,
    "float, -inf added = not allowed": lambda hidden, dtype: torch.zeros(hidden.shape, dtype=dtype).masked_fill(
        hidden, float("-inf")),
    "float, 0 = not allowed": lambda hidden, dtype: (~hidden).to(dtype),
}


@dataclass(frozen=True)
class MaskForm:
    """How a module takes a mask.

    Attributes:
        keyword: the keyword argument, or None for the fourth argument of the ``vkq`` convention.
        shape: ``"query×key"`` or ``"batch×key"``.
        form: a key of ``MASK_FORMS``.
    """

    keyword: str | None
    shape: str
    form: str

    @property
    def place(self) -> str:
        """The keyword, or ``mask (4th argument)``."""
        return self.keyword or "mask (4th argument)"

    def describe(self) -> str:
        """E.g. ``attn_mask (query_pos, key_pos), bool, True = not allowed``."""
        axes = "(query_pos, key_pos)" if self.shape == "query×key" else "(batch, key_pos)"
        return f"{self.place} {axes}, {self.form}"

    def options(self, hidden: Tensor, dtype: torch.dtype) -> dict[str, Any]:
        """The call options hiding ``hidden`` ``(query_pos, key_pos)``; a ``(batch, key_pos)`` mask hides
        the keys hidden from every query."""
        if self.shape == "batch×key":
            hidden = hidden.all(dim=0, keepdim=True)
        mask = MASK_FORMS[self.form](hidden, dtype)
        return {"vkq_mask": mask} if self.keyword is None else {self.keyword: mask}


def _candidates(convention: str) -> list[MaskForm]:
    places: list[tuple[str | None, tuple[str, str]]] = (
        [(None, ("query×key", "batch×key"))] if convention == "vkq" else [])
    for keyword in MASK_KEYWORDS:
        by_key = "padding" in keyword or keyword == "attention_mask"
        places.append((keyword, ("batch×key", "query×key") if by_key else ("query×key", "batch×key")))
    return [MaskForm(keyword, shape, form) for keyword, shapes in places for shape in shapes for form in MASK_FORMS]


def find_mask(prober: Prober) -> MaskForm | None:
    """The first candidate that hides exactly the keys it should (module docstring), or None."""
    x = prober.random(_LENGTH)
    base = prober.observe(x).pattern
    hidden = torch.zeros(_LENGTH, _LENGTH, dtype=torch.bool)
    hidden[:, -1] = True
    kept = (base > 0) & ~hidden
    for candidate in _candidates(prober.caller.convention):
        try:
            seen = prober.observe(x, **candidate.options(hidden, prober.dtype)).pattern
        except AuditError as err:
            if err.kind == "unsupported":
                raise
            continue  # not a keyword it takes, or not a shape or form it accepts
        if seen.shape == base.shape and float(seen[..., -1].abs().max()) <= _ZERO and bool((seen[kept] > 0).all()):
            return candidate
    return None


def masked_row(prober: Prober, mask: MaskForm, unattended: Tensor, *, tolerance: float) -> str:
    """What the module returns where a query's keys are all hidden: ``"nan"``, ``"no attention"``
    (``unattended``, the output with every attention weight zero, within ``tolerance``) or
    ``"attends anyway"``."""
    x = prober.random(_LENGTH)
    hidden = torch.zeros(_LENGTH, _LENGTH, dtype=torch.bool)
    hidden[2] = True
    if mask.shape == "batch×key":
        hidden[:] = True  # a (batch, key_pos) mask hides a key from every query: hide them all
    out = prober.plain(x, **mask.options(hidden, prober.dtype))
    rows = out[2:3] if mask.shape == "query×key" else out
    if bool(rows.isnan().any()):
        return "nan"
    return "no attention" if float((rows - unattended).abs().max()) <= tolerance else "attends anyway"


@dataclass(frozen=True)
class CausalFlag:
    """What a causal flag of the forward does.

    Attributes:
        flag: the keyword, e.g. ``"is_causal"``.
        mask: where an all-allowed mask was passed with it because the module refuses the flag
            alone (``MaskForm.place``), or None.
        causal: with the flag (and weights not requested, where that can be said), changing only
            the last input leaves every earlier output unchanged.
        weights: the keyword that requests weights, or None when none was found.
        causal_with_weights: the same with weights requested, or None.
    """

    flag: str
    mask: str | None
    causal: bool
    weights: str | None
    causal_with_weights: bool | None


def _tensors_returned(raw: object) -> int:
    return sum(isinstance(t, Tensor) for t in raw) if isinstance(raw, (tuple, list)) else int(isinstance(raw, Tensor))


def causal_flag(prober: Prober, mask: MaskForm | None, *, rtol: float) -> CausalFlag | None:
    """Try each of ``CAUSAL_FLAGS`` (with an all-allowed mask if the flag alone is refused); None if none runs.

    Args:
        prober: runs the module.
        mask: how it takes a mask (``find_mask``), or None.
        rtol: an earlier output changing by at most rtol × max(1, the last one's change) is unchanged.
    """
    x = prober.random(8)
    allowed = {} if mask is None else mask.options(torch.zeros(8, 8, dtype=torch.bool), prober.dtype)
    for flag in CAUSAL_FLAGS:
        for extra in ({}, allowed) if allowed else ({},):
            options = {flag: True, **extra}
            try:
                prober.raw(x, **options)
            except AuditError as err:
                if err.kind == "unsupported":
                    raise
                continue
            return _with_weights(prober, x, flag, options, mask.place if extra and mask is not None else None, rtol)
    return None


def _causal(prober: Prober, x: Tensor, rtol: float, **options: object) -> bool:
    earlier, last = causal_changes(prober, x, **options)
    return earlier <= rtol * max(1.0, last)


def _with_weights(prober: Prober, x: Tensor, flag: str, options: dict[str, object], mask: str | None,
                  rtol: float) -> CausalFlag:
    for keyword in WEIGHT_KEYWORDS:
        try:
            without = prober.raw(x, **options, **{keyword: False})
            with_weights = prober.raw(x, **options, **{keyword: True})
        except AuditError:
            continue
        if _tensors_returned(with_weights) > _tensors_returned(without):  # it really returns weights
            return CausalFlag(flag=flag, mask=mask, causal=_causal(prober, x, rtol, **options, **{keyword: False}),
                              weights=keyword,
                              causal_with_weights=_causal(prober, x, rtol, **options, **{keyword: True}))
    return CausalFlag(flag=flag, mask=mask, causal=_causal(prober, x, rtol, **options), weights=None,
                      causal_with_weights=None)
