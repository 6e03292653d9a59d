"""The audit's result: measured fields, plain-language verdict lines, evidence tables.

Every sentence of ``AuditResult.verdict`` and every cell of the evidence tables is generated
from the measured fields; nothing is typed in. The JSON document (``to_dict``) is described
field by field in docs/audit.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from torch import Tensor

from headlab.audit.structure import Reads
from headlab.layer import MultiHeadAttention

__all__ = ["AuditResult", "Equivalence", "Evidence", "HeadEvidence", "Parameters", "config_text", "head_table",
           "measurement_table"]


@dataclass(frozen=True)
class HeadEvidence:
    """What one head reads and how it compares with head 0.

    Attributes:
        head: index in the module's own head order.
        reads_q, reads_k, reads_v: input dimensions its queries, keys and values depend on.
        qk_rank: numerical rank of its W_QK.
        ov_rank: numerical rank of its W_OV.
        kv_group: the key/value group it belongs to.
        qk_difference: max |W_QK − head 0's W_QK| (each in its own coordinates: its slice for
            narrow heads) over the largest |W_QK| entry; inf when the two cannot be compared.
        value_difference: the same for its values, None when the call does not show values.
    """

    head: int
    reads_q: Reads
    reads_k: Reads
    reads_v: Reads
    qk_rank: int
    ov_rank: int
    kv_group: int
    qk_difference: float
    value_difference: float | None

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict (inf as the string "inf")."""
        out = asdict(self)
        for name in ("qk_difference", "value_difference"):
            if out[name] == float("inf"):
                out[name] = "inf"
        return out


@dataclass(frozen=True)
class Parameters:
    """Parameter counts.

    Attributes:
        module: parameters of the audited module (each shared tensor counted once).
        standard: headlab's standard (wide) layer with the same d_model and n_heads, with biases:
            nn.MultiheadAttention's count.
        variant: headlab's ``variant_name`` layer at the audited sizes, with biases.
        variant_name: the closest headlab variant.
    """

    module: int
    standard: int
    variant: int
    variant_name: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Equivalence:
    """The headlab layer built from the recovered maps, checked against the module.

    Attributes:
        variant: the variant it was built as.
        config: its ``AttentionConfig`` as a dict, or None when it could not be built.
        max_abs_diff: largest |layer(x) − module(x)| on random inputs (None if not built).
        tolerance: the bound for ``verified``.
        verified: the layer reproduces the module's outputs.
        error: why the layer could not be built, or None.
    """

    variant: str
    config: dict[str, Any] | None
    max_abs_diff: float | None
    tolerance: float
    verified: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Evidence:
    """The measurements behind the verdict (docs/audit.md says how each is taken).

    Attributes:
        interception_change: max |output while intercepted − output untouched| on a random input.
        bilinear_residual: how far the scores on a random input are from the recovered W_QK, w.
        causal_earlier_change: max output change before the last position when only the last
            input changes.
        causal_last_change: the change at the last position itself.
        above_diagonal: the largest attention weight any query gives a later key (random input).
        same_slice_spread: max |pattern_h − pattern_0| on an input whose slices are all equal;
            None when n_heads < 2 or n_heads does not divide d_model.
        values_seen: the call shows each head's values (so value sharing could be tested).
        kv_heads_in_call: key/value heads the attention call received, where it shows them.
        rtol: the relative tolerance of every test.
    """

    interception_change: float
    bilinear_residual: float
    causal_earlier_change: float
    causal_last_change: float
    above_diagonal: float
    same_slice_spread: float | None
    values_seen: bool
    kv_heads_in_call: int | None
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AuditResult:
    """Everything ``headlab.audit.audit`` measured about one module (fields as in docs/audit.md).

    The tensors (``W_QK``, ``W_OV``, ``same_slice_patterns``) and the equivalent ``layer`` are
    kept for callers and the report; ``to_dict`` leaves them out.
    """

    module: str
    call: str
    call_signature: str
    batch_first: bool
    cross_attention: bool
    attention_function: str
    dtype: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    kv_groups: list[list[int]]
    d_head: int
    d_head_v: int
    size_sources: dict[str, str]
    reads: str
    shared: bool
    shared_qk: bool
    shared_v: bool | None
    causal: bool
    bilinear_scores: bool
    qk_ranks: list[int]
    ov_ranks: list[int]
    layout: str
    variant: str
    standard: bool
    parameters: Parameters
    equivalent: Equivalence
    heads: list[HeadEvidence]
    evidence: Evidence
    W_QK: Tensor = field(repr=False, compare=False)
    W_OV: Tensor = field(repr=False, compare=False)
    same_slice_patterns: Tensor | None = field(default=None, repr=False, compare=False)
    layer: MultiHeadAttention | None = field(default=None, repr=False, compare=False)

    @property
    def slice_width(self) -> int | None:
        """d_model / n_heads when it divides, else None."""
        return self.d_model // self.n_heads if self.d_model % self.n_heads == 0 else None

    @property
    def verdict(self) -> list[str]:
        """Plain-language verdict lines, most important first, generated from the fields."""
        return _verdict(self)

    def to_dict(self) -> dict[str, Any]:
        """Returns: the JSON document of ``headlab audit --json`` (docs/audit.md)."""
        skip = {"W_QK", "W_OV", "same_slice_patterns", "layer"}
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in skip:
                continue
            value = getattr(self, name)
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            elif name == "heads":
                value = [h.to_dict() for h in value]
            out[name] = value
        out["verdict"] = self.verdict
        return out


def config_text(config: dict[str, Any]) -> str:
    """``AttentionConfig(...)`` with only the fields that differ from their defaults."""
    c = config
    parts = [f"d_model={c['d_model']}", f"n_heads={c['n_heads']}"]
    if c["d_model"] % c["n_heads"] or c["d_head"] != c["d_model"] // c["n_heads"]:
        parts.append(f"d_head={c['d_head']}")
    if c["n_kv_heads"] != c["n_heads"]:
        parts.append(f"n_kv_heads={c['n_kv_heads']}")
        group = c["n_heads"] // c["n_kv_heads"]
        if c["n_heads"] % c["n_kv_heads"] or list(c["kv_head_of"]) != [h // group for h in range(c["n_heads"])]:
            parts.append(f"kv_head_of={tuple(c['kv_head_of'])}")
    if c["d_head_v"] != c["d_head"]:
        parts.append(f"d_head_v={c['d_head_v']}")
    if c["projection"] != "wide":
        parts.append(f"projection={c['projection']!r}")
    if c["causal"]:
        parts.append("causal=True")
    return f"AttentionConfig({', '.join(parts)})"


def _n(x: int) -> str:
    return f"{x:,}"


def _same(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else ", ".join(map(str, values))


def _verdict(r: AuditResult) -> list[str]:
    n, lines = r.n_heads, []
    heads = "1 head" if n == 1 else f"{n} heads"
    each, whose = ("it", "its") if n == 1 else ("each head", "each head's")
    if r.layout == "bilinear":
        size = f"with values of size {r.d_head_v}"
    else:
        size = f"of size {r.d_head}" + (f" (the rank of {whose} W_QK)" if r.size_sources["d_head"] == "rank" else "")
    if r.reads == "narrow":
        lines.append(f"{heads} {size}; each head reads only its {r.slice_width}-wide slice of the input "
                     "(queries, keys and values)")
    elif r.reads == "wide":
        lines.append(f"{heads} {size}; {each} reads all {r.d_model} input dimensions (queries, keys and values)")
    else:
        lines.append(f"{heads} {size}; the heads read different parts of the input (see the table)")
    if n > 1 and r.shared:
        role = "query, key and value projection" if r.shared_v else "query-key form (W_QK)"
        width = r.slice_width if r.reads == "narrow" else r.d_model
        spread = r.evidence.same_slice_spread
        lines.append(f"all {n} heads share one {width}×{r.d_head} {role}"
                     + (f": on an input whose slices are all the same, every head's pattern is the same "
                        f"(largest difference {spread:.1e})" if spread is not None and r.reads == "narrow" else "")
                     + (f"; every head computes the same pattern over the same values, so the heads are {n} copies "
                        "of one head (only their output projections differ)" if r.reads == "wide" else "")
                     + " — this is not the multi-head attention of Vaswani et al.")
    elif n > 1 and r.shared_qk:
        lines.append(f"all {n} heads share one query-key form (W_QK), so they compute the same patterns, but their "
                     "values differ")
    elif n > 1:
        closest = min(h.qk_difference for h in r.heads[1:])
        lines.append(f"the heads do not share their query-key forms: each head's W_QK differs from head 0's "
                     f"(smallest difference: {closest:.2g} × the largest entry)")
    if n > 1 and r.n_kv_heads == 1 and not r.shared:
        lines.append(f"1 key/value head shared by all {n} query heads (multi-query attention)")
    elif 1 < r.n_kv_heads < n:
        sizes = sorted({len(g) for g in r.kv_groups})
        group = f"a group of {sizes[0]}" if len(sizes) == 1 else "groups of " + "/".join(map(str, sizes))
        lines.append(f"{r.n_kv_heads} key/value heads, each shared by {group} query heads (grouped-query attention)")
    if r.layout == "bilinear":
        lines.append(f"each head's W_QK has rank {_same(r.qk_ranks)} = d_model: a full bilinear form per head, not "
                     f"one factored through d_head-wide W_Q and W_K (rank at most d_head)")
    else:
        lines.append(f"{whose} W_QK has rank {_same(r.qk_ranks)} (at most d_head = {r.d_head})")
    if r.causal:
        lines.append("causal: changing only the last input leaves every earlier output unchanged")
    else:
        lines.append(f"not causal: changing only the last input changes earlier outputs "
                     f"(by up to {r.evidence.causal_earlier_change:.2g})")
    if r.standard:
        lines.append("this is standard multi-head attention (Vaswani et al. 2017)")
    p = r.parameters
    lines.append(f"{_n(p.module)} parameters, against {_n(p.standard)} for the standard layer with d_model "
                 f"{r.d_model} and {heads} and {_n(p.variant)} for headlab's {p.variant_name!r} variant")
    e = r.equivalent
    if e.verified:
        lines.append(f"equivalent headlab layer: MultiHeadAttention({config_text(e.config)}) with the recovered "
                     f"weights reproduces its outputs (largest difference {e.max_abs_diff:.1e})")
    else:
        why = e.error if e.error else f"a layer built from the recovered maps differs by up to {e.max_abs_diff:.2g}"
        lines.append(f"closest headlab variant: {r.variant!r}; no exact equivalent ({why})")
    if not r.bilinear_scores:
        lines.append(f"warning: the scores are not a bilinear form of the inputs (residual "
                     f"{r.evidence.bilinear_residual:.2g}), e.g. positions enter them: W_QK, reads and ranks "
                     "describe the probe inputs only")
    if r.evidence.interception_change > r.evidence.rtol:
        lines.append(f"warning: intercepting the attention changed the output by {r.evidence.interception_change:.2g}")
    return lines


def _reads_text(reads: Reads) -> str:
    if reads.kind == "wide":
        return f"all {reads.dims}"
    if reads.kind == "narrow":
        return f"slice {reads.slice_index} [{reads.start}:{reads.stop})" + (
            f", {reads.dims} dims" if reads.dims != reads.stop - reads.start else "")
    if reads.kind == "partial":
        return f"{reads.dims} dims in [{reads.start}:{reads.stop})"
    return "nothing"


def head_table(result: AuditResult) -> tuple[list[str], list[list[str]]]:
    """The per-head evidence table: headers and rows of text."""
    headers = ["head", "queries read", "keys read", "values read", "rank W_QK", "rank W_OV", "kv group",
               "Δ W_QK vs head 0", "Δ values vs head 0"]
    rows = []
    for h in result.heads:
        rows.append([str(h.head), _reads_text(h.reads_q), _reads_text(h.reads_k), _reads_text(h.reads_v),
                     str(h.qk_rank), str(h.ov_rank), str(h.kv_group), f"{h.qk_difference:.1e}",
                     "not seen" if h.value_difference is None else f"{h.value_difference:.1e}"])
    return headers, rows


def measurement_table(result: AuditResult) -> tuple[list[str], list[list[str]]]:
    """The measurements behind the verdict: what, value, how (headers and rows of text)."""
    e, q = result.evidence, result.equivalent
    rows = [
        ["attention call", result.attention_function, "the torch function seen computing the pattern"],
        ["calling convention", result.call_signature, "the first convention under which the module attends"],
        ["interception change", f"{e.interception_change:.1e}", "max |output intercepted − output untouched|"],
        ["bilinear residual", f"{e.bilinear_residual:.1e}", "scores on a random input vs the recovered W_QK"],
        ["causal: earlier change", f"{e.causal_earlier_change:.1e}", "max earlier-output change, last input changed"],
        ["causal: last change", f"{e.causal_last_change:.1e}", "the change at the last position itself"],
        ["weight on later keys", f"{e.above_diagonal:.1e}", "largest attention weight on a later position"],
        ["same-slice pattern spread", "n/a" if e.same_slice_spread is None else f"{e.same_slice_spread:.1e}",
         "max |pattern_h − pattern_0| when every slice of the input is the same"],
        ["values seen", "yes" if e.values_seen else "no", "the call shows each head's values"],
        ["equivalent layer Δ", "n/a" if q.max_abs_diff is None else f"{q.max_abs_diff:.1e}",
         f"max |headlab layer − module| on random inputs (tolerance {q.tolerance:.0e})"],
    ]
    return ["measurement", "value", "how"], rows
