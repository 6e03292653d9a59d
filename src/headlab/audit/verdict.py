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

__all__ = ["AuditResult", "Equivalence", "Evidence", "ForwardOptions", "HeadEvidence", "Parameters", "config_text"]


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
        score_steps: the steps between the inputs and the scores that are not bilinear
            (``headlab.audit.lineage``), in sorted order.
        output_residual: superposition residual of the output at fixed patterns (0: linear).
        output_steps: the steps between the patterns (or the inputs) and the output that are not linear.
        bypass_change: max output change with every attention weight set to zero (0: nothing
            reaches the output around the attention).
        causal_earlier_change: max output change before the last position when only the last
            input changes.
        causal_last_change: the change at the last position itself.
        above_diagonal: the largest attention weight any query gives a later key (random input).
        same_slice_spread: max |pattern_h − pattern_0| on an input whose slices are all equal;
            None when n_heads < 2 or n_heads does not divide d_model.
        values_seen: the call shows each head's values (so value sharing could be tested).
        kv_heads_in_call: key/value heads the attention call received, where it shows them.
        construction_change: max output difference between two constructions with the same
            seed on one input; None when no second construction was given.
        rtol: the relative tolerance of every test.
    """

    interception_change: float
    bilinear_residual: float
    score_steps: list[str]
    output_residual: float
    output_steps: list[str]
    bypass_change: float
    causal_earlier_change: float
    causal_last_change: float
    above_diagonal: float
    same_slice_spread: float | None
    values_seen: bool
    kv_heads_in_call: int | None
    construction_change: float | None
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ForwardOptions:
    """What the forward's mask and causal flag do (``headlab.audit.masks``); None where not found.

    Attributes:
        mask: how the forward takes a mask (``MaskForm.describe``).
        masked_row: where a query's keys are all masked: ``"nan"``, ``"no attention"`` or
            ``"attends anyway"``.
        masked_row_scope: ``"one query"`` (a (query_pos, key_pos) mask) or ``"every query"``
            (a (batch, key_pos) mask hides every key of the batch item).
        causal_flag: the keyword of a causal flag, e.g. ``"is_causal"``.
        causal_flag_mask: where an all-allowed mask was passed with the flag, because the module
            refuses the flag alone (nn.MultiheadAttention does).
        causal_with_flag: causal with the flag (weights not requested where that can be said).
        weights_keyword: the keyword that requests attention weights, e.g. ``"need_weights"``.
        causal_with_flag_and_weights: causal with the flag and weights requested.
    """

    mask: str | None
    masked_row: str | None
    masked_row_scope: str | None
    causal_flag: str | None
    causal_flag_mask: str | None
    causal_with_flag: bool | None
    weights_keyword: str | None
    causal_with_flag_and_weights: bool | None

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
    attention_calls: int
    dtype: str
    computed_in: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    kv_groups: list[list[int]]
    kv_sharing: str
    d_head: int
    d_head_v: int
    size_sources: dict[str, str]
    reads: str
    shared: bool
    shared_qk: bool
    shared_v: bool | None
    causal: bool
    bilinear_scores: bool
    linear_output: bool
    qk_ranks: list[int]
    ov_ranks: list[int]
    layout: str
    variant: str
    standard: bool
    parameters: Parameters
    equivalent: Equivalence
    heads: list[HeadEvidence]
    evidence: Evidence
    options: ForwardOptions
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


def _steps(steps: list[str]) -> str:
    return "; ".join(steps) if steps else "no step the audit follows (torch functions only)"


def _size(r: AuditResult, whose: str) -> str:
    if r.layout == "bilinear":
        return f"with values of size {r.d_head_v}"
    source = r.size_sources["d_head"]
    return f"of size {r.d_head}" + {"call": "", "rank": f" (the rank of {whose} W_QK)",
                                     "values": f" (the rank of {whose} W_OV: the scores are not bilinear)"}[source]


def _heads_lines(r: AuditResult, heads: str, each: str, whose: str) -> list[str]:
    lines = []
    if r.reads == "narrow":
        lines.append(f"{heads} {_size(r, whose)}; each head reads only its {r.slice_width}-wide slice of the input "
                     "(queries, keys and values)")
    elif r.reads == "wide":
        lines.append(f"{heads} {_size(r, whose)}; {each} reads all {r.d_model} input dimensions (queries, keys and "
                     "values)")
    else:
        lines.append(f"{heads} {_size(r, whose)}; the heads read different parts of the input (see the table)")
    if r.attention_calls > 1:
        lines.append(f"the {heads} are computed by {r.attention_calls} attention calls in one forward "
                     f"({r.attention_function}: a loop over heads or a list of head modules), read together as one "
                     "layer")
    return lines


def _sharing_lines(r: AuditResult) -> list[str]:
    n, lines = r.n_heads, []
    if n > 1 and r.shared:
        role = "query, key and value projection" if r.shared_v else "query-key form (W_QK)"
        width = r.slice_width if r.reads == "narrow" else r.d_model
        spread = r.evidence.same_slice_spread
        lines.append(f"all {n} heads share one {width}×{r.d_head} {role}"
                     + (f": on an input whose slices are all the same, every head's pattern is the same (largest "
                        f"difference {spread:.1e})" if spread is not None and r.reads == "narrow" else "")
                     + (f"; every head computes the same pattern over the same values, so the heads are {n} copies "
                        "of one head (only their output projections differ)" if r.reads == "wide" else "")
                     + " — this is not the multi-head attention of Vaswani et al.")
    elif n > 1 and r.shared_qk:
        lines.append(f"all {n} heads share one query-key form (W_QK), so they compute the same patterns, but their "
                     "values differ")
    elif n > 1 and r.bilinear_scores:
        closest = min(h.qk_difference for h in r.heads[1:])
        lines.append(f"the heads do not share their query-key forms: each head's W_QK differs from head 0's "
                     f"(smallest difference: {closest:.2g} × the largest entry)")
    elif n > 1:
        lines.append("the heads' scores differ from head 0's on the probe inputs (their query-key forms cannot be "
                     "compared: the scores are not bilinear)")
    if r.kv_sharing == "cannot be told":
        lines.append(f"key/value sharing cannot be told apart: every head's keys and values read all {r.d_model} input "
                     f"dimensions through maps of full rank (d_head ≥ d_model), so one key/value head shared by all "
                     f"{n} heads would compute the same as {n} separate ones")
    elif n > 1 and r.n_kv_heads == 1 and not r.shared:
        lines.append(f"1 key/value head shared by all {n} query heads (multi-query attention)"
                     + (", read from the values alone" if r.kv_sharing == "values only" else ""))
    elif 1 < r.n_kv_heads < n:
        sizes = sorted({len(g) for g in r.kv_groups})
        group = f"a group of {sizes[0]}" if len(sizes) == 1 else "groups of " + "/".join(map(str, sizes))
        lines.append(f"{r.n_kv_heads} key/value heads, each shared by {group} query heads (grouped-query attention)"
                     + (", read from the values alone" if r.kv_sharing == "values only" else ""))
    return lines


def _options_lines(r: AuditResult) -> list[str]:
    o, lines = r.options, []
    if o.masked_row is not None:
        who = "a query whose keys are all masked" if o.masked_row_scope == "one query" else \
            "a batch item whose keys are all masked"
        what = {"nan": "gets NaN", "no attention": "gets no attention (its output is what zero attention weights give)",
                "attends anyway": "still attends (the masked keys get weight: a finite fill such as -1e9 instead "
                                  "of -inf)"}[o.masked_row]
        lines.append(f"{who} {what} (mask: {o.mask})")
    if o.causal_flag is not None and not r.causal and (o.causal_with_flag or o.causal_with_flag_and_weights):
        flag = f"{o.causal_flag}=True" + (f" (passed with an all-allowed {o.causal_flag_mask}, which it requires)"
                                          if o.causal_flag_mask else "")
        weights = f"{o.weights_keyword}=True"
        if o.weights_keyword is None:
            lines.append(f"{flag} makes it causal")
        elif o.causal_with_flag and o.causal_with_flag_and_weights:
            lines.append(f"{flag} makes it causal, with or without {weights}")
        elif o.causal_with_flag:
            lines.append(f"{flag} is ignored when weights are requested: with {weights} earlier outputs change with "
                         f"the last input (with {o.weights_keyword}=False it is causal)")
        else:
            lines.append(f"{flag} makes it causal only when weights are requested ({weights})")
    return lines


def _warnings(r: AuditResult) -> list[str]:
    e, lines = r.evidence, []
    if r.computed_in != r.dtype:
        lines.append(f"the module computes in {r.computed_in} inside its forward (it casts the {r.dtype} probe inputs "
                     f"down, e.g. with .float()), so every test uses {r.computed_in}'s tolerance ({e.rtol:.0e})")
    if not r.bilinear_scores:
        lines.append(f"warning: the scores are not a bilinear form of the inputs (residual {e.bilinear_residual:.2g}); "
                     f"what breaks it: {_steps(e.score_steps)}. Head size, key/value groups and sharing are read from "
                     "the values; W_QK and its ranks describe the probe inputs only")
    if not r.linear_output:
        lines.append(f"warning: the output is not linear in the values at fixed attention weights (residual "
                     f"{e.output_residual:.2g}); what breaks it: {_steps(e.output_steps)}. W_OV describes unit inputs "
                     "only")
    if e.bypass_change > e.rtol * max(1.0, e.causal_last_change):
        lines.append(f"warning: part of the output goes around the attention: with every attention weight set to zero "
                     f"it still changes with the input (by up to {e.bypass_change:.2g}), e.g. a residual connection "
                     "inside the module; each head's W_OV includes that path")
    if e.construction_change is not None and e.construction_change > e.rtol * max(1.0, e.causal_last_change):
        lines.append(f"warning: two constructions with the same seed compute different outputs (by up to "
                     f"{e.construction_change:.2g}): the module's initial weights do not follow the seed (torch.empty "
                     "left uninitialised, or a random generator of its own), so the same --seed can give a different "
                     "audit")
    if e.interception_change > e.rtol:
        lines.append(f"warning: intercepting the attention changed the output by {e.interception_change:.2g}")
    return lines


def _verdict(r: AuditResult) -> list[str]:
    n = r.n_heads
    heads = "1 head" if n == 1 else f"{n} heads"
    each, whose = ("it", "its") if n == 1 else ("each head", "each head's")
    lines = _heads_lines(r, heads, each, whose) + _sharing_lines(r)
    if r.layout == "bilinear":
        lines.append(f"each head's W_QK has rank {_same(r.qk_ranks)} = d_model: a full bilinear form per head, not "
                     f"one factored through d_head-wide W_Q and W_K (rank at most d_head)")
    elif r.bilinear_scores:
        lines.append(f"{whose} W_QK has rank {_same(r.qk_ranks)} (at most d_head = {r.d_head})")
    if r.causal:
        lines.append("causal: changing only the last input leaves every earlier output unchanged")
    else:
        lines.append(f"not causal: changing only the last input changes earlier outputs "
                     f"(by up to {r.evidence.causal_earlier_change:.2g})")
    lines += _options_lines(r)
    if r.standard:
        lines.append("this is standard multi-head attention (Vaswani et al. 2017)")
    p = r.parameters
    lines.append(f"{_n(p.module)} parameters, against {_n(p.standard)} for the standard layer with d_model "
                 f"{r.d_model} and {heads} and {_n(p.variant)} for headlab's {p.variant_name!r} variant")
    e = r.equivalent
    if e.verified and e.config is not None:  # a verified layer was built: its config is there
        lines.append(f"equivalent headlab layer: MultiHeadAttention({config_text(e.config)}) with the recovered "
                     f"weights reproduces its outputs (largest difference {e.max_abs_diff:.1e})")
    else:
        why = e.error if e.error else f"a layer built from the recovered maps differs by up to {e.max_abs_diff:.2g}"
        lines.append(f"closest headlab variant: {r.variant!r}; no exact equivalent ({why})")
    return lines + _warnings(r)
