"""Is 8-head attention 1-head attention with the same weights? Does the number of heads change the output?

Axis legend:
    x        (batch, pos, d_model)            inputs
    pattern  (batch, head, query_pos, key_pos)
    y        (batch, pos, d_model)            the layer's output

Two wide layers hold the same fused weights: one reads them as 8 heads of width 64, the
other as 1 head of width 512 (the shapes of a widely shared check that compared the two with
``torch.equal`` and printed True; W_O is the identity, so the output is the heads' concatenated
z, as in that check's code). Each head takes its own softmax, so the 8-head output is a
different function of the same weights: the 1-head logits are the sum of the 8 heads' logits
(rescaled), and the softmax of a sum is not the concatenation of softmaxes.

The query weights are multiplied by a logit scale α swept over twelve decades, for two draws:
    uniform   weights and inputs uniform on [0, 1), that check's draw: all positive, so every
              head's logits grow with one common direction, are huge, and every head puts all
              its weight on the same key — the softmax is saturated and the views coincide.
    standard  headlab's initialisation (Xavier-uniform) and Gaussian inputs.
At each α: the relative output and gradient differences between the views, and the mean
maximum attention weight (1 = saturated). Does the number of heads change the output? With the
same fused weights it changes with the number of heads for random weights, but not for weights
that are the same across heads (constant) once saturated — the split then only changes the softmax
temperature, by √h, and not at all when the score scale is 1/d_head instead of 1/√d_head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from headlab.experiments.budget import check_seed, resolve_steps, single_thread
from headlab.experiments.figures import png
from headlab.experiments.progress import StepBar
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.projections import WideProjection

__all__ = ["KINDS", "HeadsVsOneResult", "ScalePoint", "plot_heads_vs_one", "run_heads_vs_one", "views"]

KINDS = ("uniform", "standard")
D_MODEL, N_HEADS, SEQ, BATCH = 512, 8, 10, 2  # the shapes of the torch.equal check
LOG10_SCALES = (-8.0, 4.0)  # α from 1e-8 to 1e4
POINTS, QUICK_POINTS = 49, 25
COINCIDE = 1e-6  # relative output difference below which the views coincide
SPLIT_HEADS = (1, 2, 4, 8, 16)


def _fused_weight(layer: MultiHeadAttention) -> Tensor:
    """A wide self-attention layer's fused ``in_proj_weight`` (its inputs have one width)."""
    projection = layer.projection
    assert isinstance(projection, WideProjection) and projection.in_proj_weight is not None
    return projection.in_proj_weight


def views(weights: Tensor, n_heads: tuple[int, ...], *, scale: str = "sqrt") -> list[MultiHeadAttention]:
    """Wide layers (no biases, W_O = identity) holding the same fused weights, one per number of heads.

    Args:
        weights: ``(3·d_model, d_model)`` fused [W_Q; W_K; W_V] rows, as ``in_proj_weight``.
        n_heads: the numbers of heads to read the weights as.
        scale: ``"sqrt"`` for the standard score scale 1/√d_head, ``"linear"`` for 1/d_head.

    Returns:
        One layer per entry of ``n_heads``, in the weights' dtype.

    Raises:
        ValueError: an unknown scale, or a number of heads that does not divide d_model.
    """
    if scale not in ("sqrt", "linear"):
        raise ValueError(f"scale={scale!r} must be 'sqrt' (1/√d_head) or 'linear' (1/d_head)")
    d_model = weights.shape[1]
    layers = []
    for h in n_heads:
        d_head = d_model // h
        config = AttentionConfig(d_model=d_model, n_heads=h, bias=False,
                                 scale=None if scale == "sqrt" else 1.0 / d_head)
        layer = MultiHeadAttention(config).to(weights.dtype)
        with torch.no_grad():
            _fused_weight(layer).copy_(weights)
            layer.projection.out_proj.weight.copy_(torch.eye(d_model, dtype=weights.dtype))
        layers.append(layer)
    return layers


def _draw(kind: str, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Fused weights ``(3·d_model, d_model)`` and inputs ``(batch, seq, d_model)`` in float64."""
    if kind == "uniform":
        weights = torch.rand(3 * D_MODEL, D_MODEL, generator=generator, dtype=torch.float64)
        return weights, torch.rand(BATCH, SEQ, D_MODEL, generator=generator, dtype=torch.float64)
    bound = (6.0 / (D_MODEL + 3 * D_MODEL)) ** 0.5  # Xavier-uniform bound of the fused weight
    weights = (torch.rand(3 * D_MODEL, D_MODEL, generator=generator, dtype=torch.float64) * 2 - 1) * bound
    return weights, torch.randn(BATCH, SEQ, D_MODEL, generator=generator, dtype=torch.float64)


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(torch.finfo(b.dtype).tiny))


@dataclass
class ScalePoint:
    """Both views at one logit scale α.

    Attributes:
        alpha: the multiplier on W_Q.
        logit_std: std over keys of the 8-head view's scaled logits, averaged over rows.
        output_difference: ‖y₈ − y₁‖ / ‖y₁‖.
        gradient_difference: ‖∇₈ − ∇₁‖ / ‖∇₁‖, gradients of ⟨y, g⟩ (fixed random g) with respect to
            the fused weights.
        max_weight_multi, max_weight_single: mean over rows of the largest attention weight.
        same_key_share: share of (batch, query) rows where every head of both views attends most to one
            key.
    """

    alpha: float
    logit_std: float
    output_difference: float
    gradient_difference: float
    max_weight_multi: float
    max_weight_single: float
    same_key_share: float


def _point(multi: MultiHeadAttention, single: MultiHeadAttention, weights: Tensor, x: Tensor, g: Tensor,
           alpha: float) -> ScalePoint:
    """Load ``weights`` with W_Q scaled by ``alpha`` into both views and compare them."""
    outs: list[Tensor] = []
    grads: list[Tensor] = []
    top: list[Any] = []
    argmax: list[Any] = []
    for layer in (multi, single):
        w = _fused_weight(layer)
        with torch.no_grad():
            w.copy_(weights)
            w[:D_MODEL] *= alpha
        w.grad = None
        out = layer(x, return_pattern=True)
        (out.output * g).sum().backward()
        outs.append(out.output.detach())
        assert w.grad is not None  # the backward above filled it
        grads.append(w.grad)
        top.append(float(out.pattern.detach().max(-1).values.mean()))
        argmax.append(out.pattern.detach().argmax(-1))  # (batch, head, query_pos)
    with torch.no_grad():
        q, k, _ = multi.projection(x, x, x)  # (batch, n_heads, pos, d_head)
        logits = q @ k.transpose(-1, -2) * multi.config.softmax_scale
    return ScalePoint(alpha=alpha, logit_std=float(logits.std(-1).mean()),
                      output_difference=_relative(outs[0], outs[1]), gradient_difference=_relative(grads[0], grads[1]),
                      max_weight_multi=top[0], max_weight_single=top[1],
                      same_key_share=float((argmax[0] == argmax[1]).all(dim=1).double().mean()))


def _coincide_from(points: list[ScalePoint]) -> float | None:
    """The smallest α past the peak difference from which the views coincide to the end of the sweep."""
    peak = max(range(len(points)), key=lambda i: points[i].output_difference)
    tail = None
    for p in reversed(points[peak:]):
        if p.output_difference >= COINCIDE:
            break
        tail = p.alpha
    return tail


@dataclass
class HeadsVsOneResult:
    """The heads-vs-one experiment's claims and sweeps (``--json`` schema: docs/experiments.md).

    Attributes:
        sweeps: kind → the points of its sweep, α ascending.
        max_output_difference, max_difference_alpha: kind → the largest relative output difference
            over the sweep and the α where it occurs (the views differ at moderate scale).
        gradient_difference_at_max: kind → the gradient difference at that α.
        coincide_from_alpha: kind → the α from which the views coincide (< 1e-6) to the end of
            the sweep past the peak, or None when they never do (the standard draw: saturated
            heads pick different keys).
        as_drawn: kind → the point at α = 1 (the weights as drawn; for uniform, the torch.equal check's).
        float32_check_equal: the check as it was shared, in float32: torch.equal of the two views' outputs
            on uniform weights and inputs.
        by_heads: does the number of heads change the output? case → {n_heads: relative difference
            from the 1-head output of the same fused weights}; cases
            ``random`` (standard draw), ``constant`` (all-ones weights, uniform inputs),
            ``constant_small`` (constant 1e-3 weights: unsaturated), ``constant_small_linear_scale``
            (the same with score scale 1/d_head).
    """

    seed: int
    points: int
    sweeps: dict[str, list[ScalePoint]]
    max_output_difference: dict[str, float]
    max_difference_alpha: dict[str, float]
    gradient_difference_at_max: dict[str, float]
    coincide_from_alpha: dict[str, float | None]
    as_drawn: dict[str, ScalePoint]
    float32_check_equal: bool
    by_heads: dict[str, dict[int, float]]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The claims as (headers, rows) of text."""
        rows = []
        for kind in self.sweeps:
            drawn, start = self.as_drawn[kind], self.coincide_from_alpha[kind]
            rows += [
                [f"{kind}: max output difference (at α)",
                 f"{self.max_output_difference[kind]:.3g} (α={self.max_difference_alpha[kind]:.1e})"],
                [f"{kind}: gradient difference there", f"{self.gradient_difference_at_max[kind]:.3g}"],
                [f"{kind}: views coincide (< {COINCIDE:g}) from α", "never in the sweep" if start is None
                 else f"{start:.1e}"],
                [f"{kind}, as drawn (α=1): output difference; mean max weight 8 heads / 1 head; same top key",
                 f"{drawn.output_difference:.3g}; {drawn.max_weight_multi:.3f} / {drawn.max_weight_single:.3f}; "
                 f"{drawn.same_key_share:.0%} of rows"],
            ]
        rows.append(["uniform draw in float32: torch.equal(8 heads, 1 head)", str(self.float32_check_equal)])
        for case, diffs in self.by_heads.items():
            rows.append([f"{case} weights: output difference from 1 head at {', '.join(map(str, diffs))} heads",
                         ", ".join(f"{d:.2g}" for d in diffs.values())])
        return ["claim", "value"], rows

    def sentences(self) -> list[str]:
        """The measured answers (is 8-head attention 1-head attention with the same weights, and does the
        number of heads change the output?), in sentences generated from the numbers."""
        std, uni, start = self.as_drawn["standard"], self.as_drawn["uniform"], self.coincide_from_alpha
        same = std.output_difference < COINCIDE
        out = [
            f"The same weights read as {N_HEADS} heads and as 1 head "
            + ("gave the same output here" if same else "are different functions")
            + f": with headlab's initialisation the outputs differ by {std.output_difference:.0%} (relative) as "
            f"drawn and by up to {self.max_output_difference['standard']:.0%} over the sweep, and the gradients by "
            f"{std.gradient_difference:.0%} as drawn. Each head takes its own softmax; one head takes one softmax "
            f"of the sum of the {N_HEADS} heads' logits.",
            f"A widely shared check compares {N_HEADS} heads and 1 head with torch.equal on uniform-random "
            f"weights and inputs. Their logits have a std of "
            f"{uni.logit_std:,.0f} over keys, the mean largest attention weight is {uni.max_weight_multi:.3f} "
            f"with {N_HEADS} heads and {uni.max_weight_single:.3f} with 1, and in {uni.same_key_share:.0%} of the "
            f"rows every head of both views attends most to the same key: the relative difference is "
            f"{uni.output_difference:.1e}, and torch.equal in float32 returns {self.float32_check_equal}. Scaled "
            f"down, the same weights give outputs up to {self.max_output_difference['uniform']:.1%} apart (at "
            f"α = {self.max_difference_alpha['uniform']:.0e}), "
            + (f"and the views coincide (difference < {COINCIDE:g}) from α = {start['uniform']:.0e} on, where "
               f"the mean largest weight is {self._at(start['uniform']).max_weight_multi:.3f}."
               if start["uniform"] is not None else "and they never coincide within the sweep."),
        ]
        last = self.sweeps["standard"][-1]
        if start["standard"] is None:
            out.append(f"Saturation alone does not make the views agree: with headlab's initialisation, at "
                       f"α = {last.alpha:.0e} (mean max weight {last.max_weight_multi:.3f}) the difference is still "
                       f"{last.output_difference:.0%}, and all heads agree with the single head on the top key in "
                       f"{last.same_key_share:.0%} of the rows.")
        t = self.by_heads
        changes = min(t["random"].values()) >= COINCIDE
        constant = max(t["constant"].values())
        out.append(
            "Does the number of heads change the output? With the same fused weights, it "
            + ("changes" if changes else "does not always change")
            + f" with the number of heads for random weights (relative difference from 1 head: "
            f"{', '.join(f'{d:.0%}' for d in t['random'].values())} for {', '.join(map(str, t['random']))} heads)"
            + (" and not" if constant < COINCIDE else " and also")
            + f" for all-ones weights (largest difference {constant:.1e}). Weights that are the same across heads "
            f"give every head the same pattern, and splitting them changes only the softmax temperature, by √h: "
            f"with small constant weights (unsaturated) the difference is {max(t['constant_small'].values()):.1e}, "
            f"and {max(t['constant_small_linear_scale'].values()):.1e} when the score scale is 1/d_head instead "
            f"of 1/√d_head.")
        return out

    def _at(self, alpha: float, kind: str = "uniform") -> ScalePoint:
        return next(p for p in self.sweeps[kind] if p.alpha == alpha)

    def to_dict(self) -> dict[str, Any]:
        out = {"experiment": "heads-vs-one"} | asdict(self)
        out["by_heads"] = {case: {str(h): d for h, d in diffs.items()} for case, diffs in self.by_heads.items()}
        return out


def _by_heads(generator: torch.Generator) -> dict[str, dict[int, float]]:
    random_weights, random_x = _draw("standard", generator)
    uniform_x = torch.rand(BATCH, SEQ, D_MODEL, generator=generator, dtype=torch.float64)
    ones = torch.ones(3 * D_MODEL, D_MODEL, dtype=torch.float64)
    cases = {"random": (random_weights, random_x, "sqrt"), "constant": (ones, uniform_x, "sqrt"),
             "constant_small": (ones * 1e-3, uniform_x, "sqrt"),
             "constant_small_linear_scale": (ones * 1e-3, uniform_x, "linear")}
    out = {}
    with torch.no_grad():
        for case, (weights, x, scale) in cases.items():
            ys = [layer(x) for layer in views(weights, SPLIT_HEADS, scale=scale)]
            out[case] = {h: _relative(y, ys[0]) for h, y in zip(SPLIT_HEADS[1:], ys[1:])}
    return out


@single_thread()
def run_heads_vs_one(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                     progress: bool = False) -> HeadsVsOneResult:
    """Sweep the logit scale for the 8-head and 1-head views of the same weights.

    Args:
        seed: seeds the weights, inputs and the gradient's probe direction.
        steps: logit scales in the sweep (at least 3; default 49, 25 with ``quick``), log-spaced
            over α in [1e-8, 1e4], plus α = 1.
        quick: the small version.
        progress: show a progress bar on stderr.

    Returns:
        A ``HeadsVsOneResult``.

    Raises:
        ValueError: a bad seed, or fewer than 3 scales.
    """
    seed = check_seed(seed)
    points = resolve_steps(steps, default=POINTS, quick_default=QUICK_POINTS, quick=quick)
    if points < 3:
        raise ValueError(f"steps={points}: heads-vs-one sweeps at least 3 logit scales")
    generator = torch.Generator().manual_seed(seed)
    alphas = sorted(set(torch.logspace(*LOG10_SCALES, points, dtype=torch.float64).tolist()) | {1.0})
    sweeps: dict[str, list[ScalePoint]] = {}
    as_drawn: dict[str, ScalePoint] = {}
    with StepBar(enabled=progress, total=len(KINDS) * len(alphas), description="heads-vs-one") as bar:
        for kind in KINDS:
            weights, x = _draw(kind, generator)
            g = torch.randn(x.shape, generator=generator, dtype=x.dtype)
            multi, single = views(weights, (N_HEADS, 1))
            sweeps[kind] = []
            for alpha in alphas:
                sweeps[kind].append(_point(multi, single, weights, x, g, alpha))
                bar.advance(run=f"{kind} α={alpha:.1e}")
            as_drawn[kind] = next(p for p in sweeps[kind] if p.alpha == 1.0)
    # The check as it was shared, in float32: uniform weights and inputs, 8 heads vs 1, exact equality.
    weights, x = (t.float() for t in _draw("uniform", torch.Generator().manual_seed(seed)))
    with torch.no_grad():
        multi, single = views(weights, (N_HEADS, 1))
        check = torch.equal(multi(x), single(x))
    peaks = {kind: max(points_, key=lambda p: p.output_difference) for kind, points_ in sweeps.items()}
    return HeadsVsOneResult(
        seed=seed, points=len(alphas), sweeps=sweeps,
        max_output_difference={k: p.output_difference for k, p in peaks.items()},
        max_difference_alpha={k: p.alpha for k, p in peaks.items()},
        gradient_difference_at_max={k: p.gradient_difference for k, p in peaks.items()},
        coincide_from_alpha={k: _coincide_from(points_) for k, points_ in sweeps.items()},
        as_drawn=as_drawn, float32_check_equal=check, by_heads=_by_heads(generator),
    )


def plot_heads_vs_one(result: HeadsVsOneResult) -> bytes:
    """Output difference and saturation against the logit scale, one line per draw, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    diff_ax, sat_ax = fig.subplots(1, 2, sharex=True)
    floor = 1e-17  # exact zeros drawn here on the log axis
    for kind, colour in zip(result.sweeps, ("tab:red", "tab:blue")):
        points = result.sweeps[kind]
        alphas = [p.alpha for p in points]
        diff_ax.plot(alphas, [max(p.output_difference, floor) for p in points], color=colour, label=f"{kind}: output")
        diff_ax.plot(alphas, [max(p.gradient_difference, floor) for p in points], color=colour, linestyle="--",
                     label=f"{kind}: gradient")
        sat_ax.plot(alphas, [p.max_weight_multi for p in points], color=colour, label=f"{kind}: 8 heads")
        sat_ax.plot(alphas, [p.max_weight_single for p in points], color=colour, linestyle=":",
                    label=f"{kind}: 1 head")
        start = result.coincide_from_alpha[kind]
        if start is not None:
            for ax in (diff_ax, sat_ax):
                ax.axvspan(start, alphas[-1], color=colour, alpha=0.08)
            diff_ax.annotate(f"{kind}: coincide from α={start:.0e}", (start, COINCIDE), fontsize="small",
                             color=colour, xytext=(4, 8), textcoords="offset points")
        drawn = result.as_drawn[kind]
        diff_ax.plot([1.0], [max(drawn.output_difference, floor)], marker="o", color=colour)
    diff_ax.axhline(COINCIDE, color="grey", linewidth=0.8, linestyle=":")
    diff_ax.set(xscale="log", yscale="log", xlabel="logit scale α (× W_Q; dot: weights as drawn)",
                ylabel="relative difference, 8 heads vs 1 head")
    sat_ax.set(xscale="log", xlabel="logit scale α", ylabel="mean max attention weight", ylim=(0, 1.05))
    for ax in (diff_ax, sat_ax):
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Same weights, 8 heads vs 1 head (d_model {D_MODEL}, {SEQ} positions, seed {result.seed}); "
                 f"exact zeros drawn at {floor:g}")
    return png(fig)
