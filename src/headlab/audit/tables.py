"""The evidence tables of an audit: one row per head, and the measurements the verdict rests on.

Every cell is text made from the measured fields of an ``AuditResult``; the command prints them
with rich, the report as HTML.
"""

from __future__ import annotations

from headlab.audit.structure import Reads
from headlab.audit.verdict import AuditResult, HeadEvidence

__all__ = ["head_table", "measurement_table"]


def _reads_text(reads: Reads) -> str:
    if reads.kind == "wide":
        return f"all {reads.dims}"
    if reads.kind == "narrow":
        return f"slice {reads.slice_index} [{reads.start}:{reads.stop})" + (
            f", {reads.dims} dims" if reads.dims != reads.stop - reads.start else "")
    if reads.kind == "partial":
        return f"{reads.dims} dims in [{reads.start}:{reads.stop})"
    return "nothing"


def _reads_cell(h: HeadEvidence) -> str:
    texts = [_reads_text(r) for r in (h.reads_q, h.reads_k, h.reads_v)]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(f"{role} {text}" for role, text in zip(("q", "k", "v"), texts))


def head_table(result: AuditResult) -> tuple[list[str], list[list[str]]]:
    """The per-head evidence table: headers and rows of text.

    What a head's queries, keys and values read is one cell (one text when the three agree);
    Δ is the difference from head 0 relative to the largest entry.
    """
    headers = ["head", "reads (q, k, v)", "rank W_QK", "rank W_OV", "kv group", "Δ W_QK", "Δ values"]
    rows = []
    for h in result.heads:
        rows.append([str(h.head), _reads_cell(h), str(h.qk_rank), str(h.ov_rank), str(h.kv_group),
                     f"{h.qk_difference:.1e}",
                     "not seen" if h.value_difference is None else f"{h.value_difference:.1e}"])
    return headers, rows


def _found(value: object) -> str:
    return "not found" if value is None else str(value)


def measurement_table(result: AuditResult) -> tuple[list[str], list[list[str]]]:
    """The measurements behind the verdict: what, value, how (headers and rows of text)."""
    e, q, o = result.evidence, result.equivalent, result.options
    causal_flag = "not found" if o.causal_flag is None else (
        f"{o.causal_flag}=True: {'causal' if o.causal_with_flag else 'not causal'}"
        + ("" if o.weights_keyword is None else f"; with {o.weights_keyword}=True: "
           f"{'causal' if o.causal_with_flag_and_weights else 'not causal'}"))
    rows = [
        ["attention call", result.attention_function + (f" ×{result.attention_calls}" if result.attention_calls > 1
                                                         else ""), "the torch function seen computing the pattern"],
        ["calling convention", result.call_signature, "the first convention under which the module attends"],
        ["computed in", result.computed_in, "the least precise dtype of any tensor computed from the inputs"],
        ["interception change", f"{e.interception_change:.1e}", "max |output intercepted − output untouched|"],
        ["bilinear residual", f"{e.bilinear_residual:.1e}", "scores on a random input vs the recovered W_QK"],
        ["output residual", f"{e.output_residual:.1e}", "f(a + b) − f(a) − f(b) + f(0) at fixed patterns"],
        ["bypass change", f"{e.bypass_change:.1e}", "max output change with every attention weight zero"],
        ["causal: earlier change", f"{e.causal_earlier_change:.1e}", "max earlier-output change, last input changed"],
        ["causal: last change", f"{e.causal_last_change:.1e}", "the change at the last position itself"],
        ["weight on later keys", f"{e.above_diagonal:.1e}", "largest attention weight on a later position"],
        ["same-slice pattern spread", "n/a" if e.same_slice_spread is None else f"{e.same_slice_spread:.1e}",
         "max |pattern_h − pattern_0| when every slice of the input is the same"],
        ["values seen", "yes" if e.values_seen else "no", "the call shows each head's values"],
        ["mask argument", _found(o.mask), "the argument that hides a key, tried in every usual form"],
        ["all keys masked", _found(o.masked_row), "what the module returns where a query's keys are all masked"],
        ["causal flag", causal_flag, "a causal flag of the forward, without and with weights requested"],
        ["two constructions Δ", "n/a" if e.construction_change is None else f"{e.construction_change:.1e}",
         "max |output − output of a second construction with the same seed|"],
        ["equivalent layer Δ", "n/a" if q.max_abs_diff is None else f"{q.max_abs_diff:.1e}",
         f"max |headlab layer − module| on random inputs (tolerance {q.tolerance:.0e})"],
    ]
    return ["measurement", "value", "how"], rows
