"""From the probes' measurements to an ``AuditResult``: reads, ranks, groups, layout, the equivalent layer.

``Measured`` collects what ``headlab.audit.run`` measured; ``findings`` reads the structure off
it with ``headlab.audit.structure``, builds and checks the equivalent headlab layer
(``headlab.audit.equivalence``) and counts parameters (``headlab.layer.accounting``). Every
decision rule is listed in docs/audit.md ("How each verdict is decided").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.audit.calling import Detected
from headlab.audit.equivalence import Recovered, build_equivalent, verify
from headlab.audit.errors import AuditError
from headlab.audit.probes import Prober, QKForms, ValueMaps
from headlab.audit.structure import (
    Reads,
    basis,
    classify_reads,
    kv_groups,
    max_relative_difference,
    own_rows,
    read_dims,
    spectrum,
)
from headlab.audit.verdict import AuditResult, Equivalence, Evidence, ForwardOptions, HeadEvidence, Parameters
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import count_parameters
from headlab.layer.presets import preset_config

__all__ = ["Measured", "Precision", "findings"]

_VERIFY_LENGTHS = (8, 9)  # the equivalent layer is checked on two random inputs (9: the longest detection run)


@dataclass(frozen=True)
class Precision:
    """Tolerances for one computing precision (docs/audit.md).

    Attributes:
        rtol: nonzero / equal / rank tests, relative to the largest value of their kind.
        output: equivalent layer vs module, relative to max(1, largest output).
    """

    rtol: float
    output: float

    @property
    def subspace(self) -> float:
        """Projector tolerance for 'same subspace': sqrt(rtol), far below the O(1) gap of distinct subspaces."""
        return math.sqrt(self.rtol)


@dataclass(frozen=True)
class Measured:
    """What the probes measured, as ``findings`` needs it.

    Attributes:
        detected: how the module is called and which attention calls are its layer.
        dtype: the probing dtype.
        computed_in: the least precise dtype the module computed in.
        precision: the tolerances of ``computed_in``.
        source, q_width: the attention function, and the query width where the call shows it.
        forms, values: the recovered maps.
        output_bias: ``(d_model,)``: the output on a zero input.
        evidence: the measurements behind the verdict.
        options: what the forward's mask and causal flag do.
        same_slice_patterns: ``(head, pos, pos)`` or None.
    """

    detected: Detected
    dtype: torch.dtype
    computed_in: torch.dtype
    precision: Precision
    source: str
    q_width: int | None
    forms: QKForms
    values: ValueMaps
    output_bias: Tensor
    evidence: Evidence
    options: ForwardOptions
    same_slice_patterns: Tensor | None


def _reads(matrix: Tensor, n_heads: int, rtol: float) -> Reads:
    return classify_reads(read_dims(matrix, rtol=rtol), n_heads=n_heads)


def _overall_reads(heads: list[tuple[Reads, Reads, Reads]]) -> str:
    kinds = {r.kind for triple in heads for r in triple}
    if kinds == {"wide"}:
        return "wide"
    slices = [{r.slice_index for r in triple if r.slice_index is not None} for triple in heads]
    if kinds == {"narrow"} and all(len(s) == 1 for s in slices) and len({min(s) for s in slices}) == len(heads):
        return "narrow"
    return "mixed"


def _classify(n_heads: int, reads: str, shared: bool, n_kv: int, qk_ranks: list[int], ov_ranks: list[int],
              d_model: int, bilinear: bool) -> tuple[str, str]:
    """(layout, closest headlab variant)."""
    if n_heads == 1:
        return "single-head", "wide"
    if reads == "narrow":
        return ("shared", "shared") if shared else ("narrow", "narrow")
    if reads != "wide":
        return "mixed", "wide"
    if bilinear and all(r == d_model for r in qk_ranks) and max(ov_ranks) < d_model:
        return "bilinear", "bilinear"
    if shared:
        return "wide-shared", "multi-query"
    if n_kv == 1:
        return "multi-query", "multi-query"
    return ("grouped-query", "grouped-query") if n_kv < n_heads else ("standard", "wide")


def findings(module: nn.Module, m: Measured, prober: Prober) -> AuditResult:
    """The ``AuditResult`` of ``module`` from what was measured (``prober`` runs the equivalence check)."""
    rtol, d_model, e = m.precision.rtol, m.detected.d_model, m.evidence
    A, w, OV = m.forms.W_QK, m.forms.w, m.values.W_OV
    n_heads = A.shape[0]
    bilinear = e.bilinear_residual <= rtol
    keyside = [torch.cat([A[h].T, w[h][:, None]], dim=1) for h in range(n_heads)]  # (d_model, d_model + 1)
    reads = [(_reads(A[h], n_heads, rtol), _reads(keyside[h], n_heads, rtol), _reads(OV[h], n_heads, rtol))
             for h in range(n_heads)]
    qk, ov = [spectrum(A[h], rtol=rtol) for h in range(n_heads)], [spectrum(OV[h], rtol=rtol) for h in range(n_heads)]
    qk_ranks, ov_ranks = [s.rank for s in qk], [s.rank for s in ov]
    # Thin matrices with the column spaces of [W_QKᵀ | w] and of W_OV (same Gram matrices, a fraction of the size).
    key_sides = [torch.cat([qk[h].thin("right"), w[h][:, None]], dim=1) for h in range(n_heads)]
    value_sides = [s.thin("left") for s in ov]
    key_bases = [basis(k, rtol=rtol) for k in key_sides]
    value_bases = [basis(v, rtol=rtol) for v in value_sides]
    full = all(b.shape[1] == d_model for b in value_bases) and (
        not bilinear or all(b.shape[1] == d_model for b in key_bases))
    if n_heads > 1 and full:
        kv_sharing, groups = "cannot be told", [[h] for h in range(n_heads)]
    else:
        kv_sharing = "tested" if bilinear else "values only"
        groups = kv_groups(key_bases if bilinear else None, value_bases, tol=m.precision.subspace)

    # Sharing: every head's maps in its own coordinates (its slice, if narrow) against head 0's.
    def qk_own(h: int) -> Tensor:  # W_QK with w as an extra row
        q, k = reads[h][0], reads[h][1]
        if q.kind == k.kind == "narrow" and q.slice_index == k.slice_index:
            block = slice(q.start, q.stop)
            return torch.cat([A[h][block, block], w[h][None, block]])
        return torch.cat([A[h], w[h][None]])

    qk_scale = float(A.abs().max())
    qk_diff = [max_relative_difference(qk_own(h), qk_own(0), scale=qk_scale) for h in range(n_heads)]
    v_diff: list[float | None] = [None] * n_heads
    shared_v = None  # values not shown
    if m.values.values is not None:
        v_scale = max(float(v.abs().max()) if v.numel() else 0.0 for v in m.values.values)
        v_own = [own_rows(v, reads[h][2]) for h, v in enumerate(m.values.values)]
        shown = [max_relative_difference(v_own[h], v_own[0], scale=v_scale) for h in range(n_heads)]
        v_diff, shared_v = list(shown), n_heads > 1 and all(d <= rtol for d in shown)
    shared_qk = n_heads > 1 and all(d <= rtol for d in qk_diff)
    shared = shared_qk and shared_v is not False

    overall = _overall_reads(reads)
    layout, variant = _classify(n_heads, overall, shared, len(groups), qk_ranks, ov_ranks, d_model, bilinear)
    causal = e.causal_earlier_change <= rtol * max(1.0, e.causal_last_change)
    linear_output = e.output_residual <= rtol
    d_head_v = max(1, m.values.value_width if m.values.value_width is not None else max(ov_ranks))
    if m.q_width is not None:
        d_head_from, d_head = "call", max(1, m.q_width)
    else:
        d_head_from, d_head = ("rank", max(1, max(qk_ranks))) if bilinear else ("values", d_head_v)
    recovered = Recovered(W_QK=A, w=w, W_OV=OV, output_bias=m.output_bias, key_sides=key_sides,
                          value_sides=value_sides, groups=groups, reads=[r[0] for r in reads], causal=causal,
                          d_head=d_head, d_head_v=d_head_v, rtol=rtol)
    equivalence, layer = _equivalent(variant, recovered, prober, m.precision, m.dtype)
    heads = [HeadEvidence(head=h, reads_q=reads[h][0], reads_k=reads[h][1], reads_v=reads[h][2],
                          qk_rank=qk_ranks[h], ov_rank=ov_ranks[h],
                          kv_group=next(g for g, group in enumerate(groups) if h in group),
                          qk_difference=qk_diff[h], value_difference=v_diff[h]) for h in range(n_heads)]
    bypass = e.bypass_change > rtol * max(1.0, e.causal_last_change)
    caller = m.detected.caller
    return AuditResult(
        module=type(module).__name__, call=caller.convention, call_signature=caller.signature,
        batch_first=caller.batch_first, cross_attention=m.detected.cross, attention_function=m.source,
        attention_calls=len(m.detected.attention_calls), dtype=str(m.dtype).removeprefix("torch."),
        computed_in=str(m.computed_in).removeprefix("torch."), d_model=d_model, n_heads=n_heads,
        n_kv_heads=len(groups), kv_groups=groups, kv_sharing=kv_sharing, d_head=d_head, d_head_v=d_head_v,
        size_sources={"d_head": d_head_from, "d_head_v": "call" if m.values.value_width is not None else "rank"},
        reads=overall, shared=shared, shared_qk=shared_qk, shared_v=shared_v, causal=causal,
        bilinear_scores=bilinear, linear_output=linear_output, qk_ranks=qk_ranks, ov_ranks=ov_ranks, layout=layout,
        variant=variant, standard=layout == "standard" and bilinear and linear_output and not bypass,
        parameters=_parameters(module, d_model, n_heads, d_head, variant, equivalence), equivalent=equivalence,
        heads=heads, evidence=e, options=m.options, W_QK=A, W_OV=OV, same_slice_patterns=m.same_slice_patterns,
        layer=layer,
    )


def _equivalent(variant: str, recovered: Recovered, prober: Prober, precision: Precision,
                dtype: torch.dtype) -> tuple[Equivalence, MultiHeadAttention | None]:
    try:
        layer = build_equivalent(variant, recovered).to(dtype)
    except (ValueError, RuntimeError) as exc:
        return Equivalence(variant, None, None, precision.output, False, f"{type(exc).__name__}: {exc}"), None
    inputs = [prober.random(length) for length in _VERIFY_LENGTHS]
    try:
        scale = max(1.0, max(float(prober.plain(x).abs().max()) for x in inputs))
        diff = verify(layer, lambda x: prober.plain(x[0])[None], [x[None] for x in inputs])
    except AuditError as exc:  # the module ran on these lengths before; say so rather than stop the audit
        return Equivalence(variant, layer.config.to_dict(), None, precision.output, False, str(exc)), None
    tolerance = precision.output * scale
    verified = diff <= tolerance
    return Equivalence(variant, layer.config.to_dict(), diff, tolerance, verified), layer if verified else None


def _parameters(module: nn.Module, d_model: int, n_heads: int, d_head: int, variant: str,
                equivalence: Equivalence) -> Parameters:
    standard = AttentionConfig(d_model=d_model, n_heads=n_heads, d_head=None if d_model % n_heads == 0 else d_head)
    if equivalence.verified and equivalence.config is not None:  # a verified layer was built
        fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in equivalence.config.items()}
        matching = AttentionConfig(**fields)
    else:
        try:
            matching = preset_config(variant, d_model=d_model, n_heads=n_heads)
        except ValueError:
            matching = standard
    standard_count = count_parameters(standard)
    return Parameters(module=sum(p.numel() for p in module.parameters()), standard=standard_count,
                      variant=standard_count if matching == standard else count_parameters(matching),
                      variant_name=variant)
