"""``audit``: say what an attention module is, from the running module alone.

The steps: copy the module (yours is never changed) in float64 (float32 if it will not run in
float64), find how to call it (``headlab.audit.calling``), probe its maps (``headlab.audit.probes``),
check them on random inputs (``headlab.audit.checks``), try its mask and causal flag
(``headlab.audit.masks``), compare it with a second construction when one is given, and read
the structure off what was measured (``headlab.audit.findings``). Thresholds: docs/audit.md.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from headlab.audit.calling import CONVENTIONS, Detected, candidate_widths, detect
from headlab.audit.checks import bilinear_residual, bypass_change, causal_changes, output_residual, same_slice_spread
from headlab.audit.errors import AuditError
from headlab.audit.findings import Measured, Precision, findings
from headlab.audit.masks import causal_flag, find_mask, masked_row
from headlab.audit.probes import Prober, qk_forms, value_maps
from headlab.audit.verdict import AuditResult, Evidence, ForwardOptions

__all__ = ["audit"]

_RANDOM_LENGTH = 8  # positions of the random probe inputs
_PRECISION = {torch.float64: Precision(rtol=1e-7, output=1e-8), torch.float32: Precision(rtol=1e-3, output=1e-3)}
_COMPLEX = {torch.float64: torch.complex128, torch.float32: torch.complex64}


def audit(module: nn.Module, *, call: str | None = None, d_model: int | None = None, seed: int = 0,
          rebuilt: nn.Module | None = None, progress: bool = False) -> AuditResult:
    """Audit an attention module: heads, head size, what each head reads, sharing, ranks, causality.

    Args:
        module: any ``nn.Module`` computing one attention layer with softmax (one call, or one per
            head or group of heads), ``F.scaled_dot_product_attention`` or ``nn.MultiheadAttention``'s
            functional path. It is copied; the copy is put in eval mode and float64.
        call: calling convention, one of ``CONVENTIONS`` (``self``: forward(x); ``qkv``:
            forward(query, key, value); ``vkq``: forward(values, keys, query, mask)); None detects it.
        d_model: input width; None tries the sizes in the module's parameter shapes, largest first.
        seed: seeds every random probe input.
        rebuilt: a second instance built the same way after seeding torch the same way: the audit
            checks that both compute the same (``evidence.construction_change``).
        progress: show a progress bar on stderr.

    Returns:
        An ``AuditResult``: its ``verdict`` lines, fields and evidence.

    Raises:
        TypeError: ``module`` or ``rebuilt`` is not an nn.Module.
        ValueError: ``call`` or ``d_model`` is invalid, or d_model cannot be inferred.
        AuditError: the module raised, computed no attention, returned the wrong shape, computed
            stacked attentions, or uses an option the audit cannot follow (``kind`` says which);
            the message names the fix where there is one.
    """
    for name, value in (("module", module), ("rebuilt", rebuilt)):
        if value is not None and not isinstance(value, nn.Module):
            raise TypeError(f"{name} must be a torch.nn.Module, got {type(value).__name__}")
    if call is not None and call not in CONVENTIONS:
        raise ValueError(f"call={call!r} is not one of {', '.join(CONVENTIONS)}")
    if d_model is not None and (isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1):
        raise ValueError(f"d_model={d_model!r} must be a positive int")
    widths = [d_model] if d_model is not None else candidate_widths(module)
    with _one_thread():
        return _audit(module, widths, call, seed, rebuilt, progress, inferred=d_model is None)


def _audit(module: nn.Module, widths: list[int], call: str | None, seed: int, rebuilt: nn.Module | None,
           progress: bool, *, inferred: bool) -> AuditResult:
    working, dtype, detected = _prepare(module, widths, call, seed, inferred=inferred)
    with _progress(progress) as tick:
        prober = Prober(working, detected, dtype=dtype, seed=seed, on_observe=tick)
        x = prober.random(_RANDOM_LENGTH)
        seen = prober.observe(x)
        n_heads = seen.scores.shape[0]
        forms = qk_forms(prober)
        values = value_maps(prober, n_heads)
        earlier, last = causal_changes(prober, x)
        same_slice = same_slice_spread(prober, n_heads, _RANDOM_LENGTH)
        interception = float((prober.plain(x) - seen.output).abs().max())
        output_bias = prober.plain(prober.zeros(3))[0]
        out_residual, out_steps = output_residual(prober, _RANDOM_LENGTH)
        bypass, unattended = bypass_change(prober, x)
        precision = _precision(prober.coarsest)
        options = _options(prober, unattended, precision)
        construction = None if rebuilt is None else _construction_change(rebuilt, dtype, detected, prober, x)
    evidence = Evidence(
        interception_change=interception, bilinear_residual=bilinear_residual(seen, forms, x),
        score_steps=sorted(seen.score_steps), output_residual=out_residual, output_steps=sorted(out_steps),
        bypass_change=bypass, causal_earlier_change=earlier, causal_last_change=last,
        above_diagonal=float(seen.pattern.triu(1).max()) if seen.pattern.shape[-1] > 1 else 0.0,
        same_slice_spread=None if same_slice is None else same_slice[0], values_seen=values.values is not None,
        kv_heads_in_call=seen.kv_heads, construction_change=construction, rtol=precision.rtol,
    )
    measured = Measured(detected=detected, dtype=dtype, computed_in=prober.coarsest, precision=precision,
                        source=seen.source, q_width=seen.q_width, forms=forms, values=values, output_bias=output_bias,
                        evidence=evidence, options=options,
                        same_slice_patterns=None if same_slice is None else same_slice[1])
    return findings(module, measured, prober)


def _working_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An eval-mode CPU copy whose floating tensors are ``dtype`` and complex ones its complex counterpart.

    ``Module.to(float64)`` would cast a complex buffer (a rotary table in complex64, say) to real,
    silently dropping its imaginary part; ``_apply`` (what ``to`` itself uses) converts each kind.

    Raises:
        AuditError: ``raised``: the module cannot be copied; ``unsupported``: a parameter holds
            NaN or inf.
    """
    def convert(t: Tensor) -> Tensor:
        return t.to(dtype) if t.is_floating_point() else t.to(_COMPLEX[dtype]) if t.is_complex() else t

    try:
        working = copy.deepcopy(module).eval().to(device="cpu")._apply(convert)
    except Exception as exc:  # the user's module
        raise AuditError("raised", f"could not copy {type(module).__name__} to audit it: "
                         f"{type(exc).__name__}: {exc}") from exc
    for name, p in working.named_parameters():
        if not bool(p.isfinite().all()):
            raise AuditError("unsupported", f"parameter {name} {tuple(p.shape)} holds NaN or inf (torch.empty left "
                             "uninitialised?); initialise it in the constructor, or build the module with --factory")
    return working


def _prepare(module: nn.Module, widths: list[int], call: str | None, seed: int, *,
             inferred: bool) -> tuple[nn.Module, torch.dtype, Detected]:
    """A private working copy in float64, or float32 if float64 will not run, and how to call it."""
    failure: AuditError | None = None
    for dtype in (torch.float64, torch.float32):
        working = _working_copy(module, dtype)
        try:
            return working, dtype, detect(working, widths=widths, convention=call, dtype=dtype, seed=seed,
                                          inferred=inferred)
        except AuditError as err:
            if err.kind == "unsupported":
                raise
            failure = err
    assert failure is not None  # each dtype raised
    raise failure


def _precision(coarsest: torch.dtype) -> Precision:
    """The tolerances of the least precise dtype the module computed in.

    Raises:
        AuditError: ``unsupported``: it computes in half precision.
    """
    for dtype, precision in _PRECISION.items():
        if torch.finfo(coarsest).eps <= torch.finfo(dtype).eps:
            return precision
    raise AuditError("unsupported", f"the module computes in {str(coarsest).removeprefix('torch.')} inside its "
                     "forward (a cast such as .half() or .to(torch.bfloat16)); the audit needs float32 or float64: "
                     "remove the cast to audit it")


def _options(prober: Prober, unattended: Tensor, precision: Precision) -> ForwardOptions:
    """The mask and causal-flag probes; ``unattended`` is the output of a position that attends to nothing."""
    mask = find_mask(prober)
    row = None if mask is None else masked_row(prober, mask, unattended,
                                               tolerance=precision.rtol * max(1.0, float(unattended.abs().max())))
    flag = causal_flag(prober, mask, rtol=precision.rtol)
    return ForwardOptions(
        mask=None if mask is None else mask.describe(), masked_row=row,
        masked_row_scope=None if mask is None else "one query" if mask.shape == "query×key" else "every query",
        causal_flag=None if flag is None else flag.flag, causal_flag_mask=None if flag is None else flag.mask,
        causal_with_flag=None if flag is None else flag.causal, weights_keyword=None if flag is None else flag.weights,
        causal_with_flag_and_weights=None if flag is None else flag.causal_with_weights)


def _construction_change(rebuilt: nn.Module, dtype: torch.dtype, detected: Detected, prober: Prober,
                         x: Tensor) -> float:
    """Largest output difference between the audited module and a second construction, on ``x``."""
    other, q = _working_copy(rebuilt, dtype), x[None]
    try:
        with torch.no_grad():
            out = detected.caller.output(detected.caller(other, q, q, q), q)[0]
    except AuditError:
        raise
    except Exception as exc:  # the user's code
        raise AuditError("raised", f"the second construction raised {type(exc).__name__}: {exc}") from exc
    return float((out.to(dtype) - prober.plain(x)).abs().max())


@contextmanager
def _one_thread() -> Iterator[None]:
    """Torch on one thread while the audit runs, as it was afterwards.

    The audit is many small products and decompositions (768-wide at most for GPT-2 small);
    threads gain little there, and on a busy machine they lose a lot: LAPACK's threaded SVD
    waits for descheduled threads (a 768-wide audit took 18-28 s on two shared cores with two
    threads, 6-9 s with one).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _progress(show: bool) -> Iterator:
    if not show:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("probing the module", total=None)
        yield lambda: bar.advance(task)
