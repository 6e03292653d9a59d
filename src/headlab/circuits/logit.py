"""Direct logit attribution: each head's result carried to the logits, per position.

Axis legend:
    result         (batch, head, query_pos, d_model)   a head's z through its slice of the output projection
    stream         (batch, pos, d_model)               the final point: what the final norm reads
    direction      (vocab,) or (batch, vocab)          what is read off the logits (answer − wrong, say)
    contributions  (head, position)                    rows in ``LogitAttribution.heads`` order

The logits at a position are ``unembed(norm(x))`` with x the final stream. Read along a direction d
(``logit[answer] − logit[wrong]`` is d = e_answer − e_wrong):

    logit_d = norm(x) · u + b_U · d,        u = W_U d

With the norm's scale s (one number per item and position) frozen at the value the run computed,
the norm is affine in x:

    norm(x) = s · P(x) ⊙ w + β              P centres x (LayerNorm) or is the identity (RMSNorm)

so the stream's parts x = Σ_h result_h + rest split the logit exactly (Elhage et al. 2021; the
"direct logit attribution" of Wang et al. 2022, TransformerLens' ``apply_ln_to_stack``):

    head h:  s · P(result_h) · (w ⊙ u)      rest: s · P(rest) · (w ⊙ u)      bias: β · u + b_U · d

A head's row is its *direct* path only (its result read by the output as it is); what later layers
make of it is in "rest". That path exists in a pre-norm causal LM (GPT-2, LLaMA, Gemma …), where every
result is added to the stream the final norm reads; encoders are refused (their norms sit on the residual
path and an MLM head transforms the stream before its norm). The parts are of the unembedding's output:
what a model does to the logits after it (Gemma 2's soft-cap, a logit scale) is not attributed, and the
result's ``note`` says so.

Cost: one forward with every selected head's result computed (the non-fused attention path for their
layers), each reduced at once to three numbers per position; nothing of size d_model per head is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.capture.taps import tapped
from headlab.circuits.graph import output_writers
from headlab.heads import HeadTable, head_label
from headlab.heads.selection import HeadSelection
from headlab.models import AttentionSite, HeadedModel, TapOutput
from headlab.models.handle import Inputs, headed
from headlab.models.stream import stream_of

__all__ = ["Direction", "LogitAttribution", "direct_logit_attribution", "plot_logit_attribution"]

Token = int | str  # a token id, or a text the tokenizer makes one token of
Direction = tuple[Token | Sequence[Token], Token | Sequence[Token]] | Tensor
TOLERANCE = 1e-4  # relative error of a norm form's reconstruction of the final norm's output


@dataclass(repr=False)
class LogitAttribution(display.Shown):
    """Each head's direct contribution to a direction of the logits, per position (mean over the batch).

    ``contributions.sum(0) + rest + bias`` equals ``logit_diff``, the model's own logits along the
    direction, at every position (up to ``error``).

    Attributes:
        heads: ``(layer, head)`` of each row.
        positions: the query positions read (of ``length``), one column each.
        contributions: ``(len(heads), len(positions))``.
        rest: ``(len(positions),)``: the stream's other parts (embeddings, MLPs, attention output biases,
            the heads not selected), through the same frozen norm.
        bias: ``(len(positions),)``: the final norm's β and the unembedding's bias, along the direction.
        logit_diff: ``(len(positions),)``: the unembedding's output along the direction, as the model ran.
        direction: what was read, in words.
        norm: the final norm and the form found for it, in words.
        tokens: item 0's token at each position, or None without a tokenizer.
        length: positions in the input.
        batch: items averaged.
        error: the largest |parts − model's own| over items and positions.
        note: what the model does to its logits after the unembedding ("" when nothing): attributed is
            the unembedding's output.
    """

    heads: list[tuple[int, int]]
    positions: list[int]
    contributions: np.ndarray
    rest: np.ndarray
    bias: np.ndarray
    logit_diff: np.ndarray
    direction: str
    norm: str
    tokens: list[str] | None
    length: int
    batch: int
    error: float
    note: str = ""

    @property
    def total(self) -> np.ndarray:
        """``(len(positions),)``: the parts summed (heads, rest and bias)."""
        return self.contributions.sum(axis=0) + self.rest + self.bias

    def column(self, position: int | None = None) -> int:
        """The column of input position ``position`` (negative counts from the input's end; None: the last
        position read).

        Raises:
            ValueError: a position that was not read.
        """
        if position is None:
            return self.positions.index(max(self.positions))
        at = position + self.length if position < 0 else position
        if at not in self.positions:
            raise ValueError(f"position {position} was not read; the result has positions {self.positions}")
        return self.positions.index(at)

    def table(self, position: int | None = None) -> HeadTable:
        """The heads' contributions at one position (``column``'s; default the last read) as a ``HeadTable``:
        column ``contribution``."""
        return HeadTable(self.heads, {"contribution": self.contributions[:, self.column(position)]})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every array as lists, rows in ``heads`` order."""
        return {"direction": self.direction, "norm": self.norm, "positions": self.positions, "tokens": self.tokens,
                "length": self.length, "batch": self.batch, "error": self.error, "note": self.note,
                "heads": [list(h) for h in self.heads], "contributions": self.contributions.tolist(),
                "rest": self.rest.tolist(), "bias": self.bias.tolist(), "logit_diff": self.logit_diff.tolist()}

    def _title(self) -> str:
        return (f"LogitAttribution: {len(self.heads)} heads × {len(self.positions)} "
                f"position{'s' if len(self.positions) != 1 else ''}, {self.direction}")

    def _facts(self) -> list[tuple[str, object]]:
        i = self.column()
        token = f" {self.tokens[i]!r}" if self.tokens else ""
        heads = float(self.contributions[:, i].sum())
        parts = (f"model {display.short(float(self.logit_diff[i]))} = heads {display.short(heads)} + rest "
                 f"{display.short(float(self.rest[i]))} + bias {display.short(float(self.bias[i]))}")
        facts: list[tuple[str, object]] = [(f"at position {self.positions[i]}{token}", parts)]
        if self.heads:
            order = np.argsort(-np.abs(self.contributions[:, i]), kind="stable")[:3]
            facts.append(("largest |head|", ", ".join(f"{head_label(*self.heads[j])} "
                                                      f"{display.short(float(self.contributions[j, i]))}"
                                                      for j in order)))
        facts += [("final norm", self.norm), ("items", self.batch)]
        if self.note:
            facts.append(("note", self.note))
        return facts

    def _parts(self) -> list[str]:
        if not self.heads:
            return []
        return [display.Html(self.table().html(["contribution"]))]


def direct_logit_attribution(model: HeadedModel | nn.Module, inputs: Inputs, direction: Direction, *,
                             heads: HeadSelection = None,
                             positions: int | Sequence[int] | None = None) -> LogitAttribution:
    """Each selected head's result, carried through the final norm (its scale frozen as the model computed it on
    this run) and the unembedding onto ``direction``; the rest of the stream and the biases as two more terms.

    The final norm is recognised by reconstructing its output on this run from its input, eps, weight and
    bias: a LayerNorm (mean removed) or an RMSNorm (weight, or 1 + weight as Gemma's); a model without one
    reads the stream as it is. What the model does to its logits after the unembedding (Gemma 2's final
    soft-cap, a logit scale) is not attributed: the parts sum to the unembedding's output, and the result's
    ``note`` says the model's output differs. One forward; per selected head three dot products per
    position (its result is reduced as its layer runs, never kept).

    Args:
        model: a ``HeadedModel`` or an attached model with a language-model head (a causal LM, say).
        inputs: what ``HeadedModel.inputs`` takes; unpadded (texts of one token length, or one text).
        direction: ``(answer, wrong)``: token ids or one-token texts, each one for the batch or a sequence
            of one per item (the logit difference); or a tensor ``(vocab,)`` or ``(batch, vocab)`` (the
            logits' dot product with it).
        heads: the heads given rows (``headlab.heads.selection``); None for every head. Heads not
            selected are not computed: their results are part of ``rest``.
        positions: the query positions read (negative counts from the end); None for every position.

    Returns:
        A ``LogitAttribution`` (means over the batch).

    Raises:
        ValueError: a model without an unembedding (no LM head), an encoder, a padded batch, a final norm of no
            known form (the message says what was tried), a bad direction or position; in an encoder-decoder
            (whose decoder's heads are attributed, over its positions), an encoder head selected, or an operation
            between the decoder's last norm and the unembedding (T5).
    """
    handle = headed(model)
    kwargs = handle.inputs(inputs)
    batch, length = _batch_and_length(kwargs)
    stream = stream_of(handle, kwargs)
    try:
        unembed_weight = stream.W_U.t().detach()  # (vocab, d_model)
    except ValueError as err:
        raise ValueError(f"{handle.architecture}: direct logit attribution needs logits: {err}") from None
    unembedding, norm = stream.unembedding, stream.final_norm
    assert unembedding is not None  # W_U raised otherwise
    writers = output_writers(handle.sites)
    if not all(site.causal for site in writers if not site.cross):
        raise ValueError(f"{handle.architecture} has heads that see later tokens (an encoder): direct logit "
                         "attribution reads a causal LM's residual stream, whose heads' results reach the final norm "
                         "by additions only; an encoder's norms sit on its residual path and its MLM head transforms "
                         f"the stream (before {stream.final.name}), so a head has no direct path to the logits")
    if norm is None and len(writers) < len(handle.sites):  # an encoder-decoder's decoder ends in a norm
        raise ValueError(f"{handle.architecture}: no norm makes what its unembedding ({stream.unembedding_name}) "
                         "reads: an operation lies between its decoder's last norm and the logits (T5 scales the "
                         "stream before its tied output embedding), through which the heads cannot be carried")
    selection = _writing(handle.heads(heads), writers, every=heads is None)
    columns = _positions(positions, length)
    compute = torch.promote_types(unembed_weight.dtype, torch.float32)
    d, label = _direction(handle, direction, vocab=unembed_weight.shape[0], batch=batch)
    d = d.to(device=unembed_weight.device, dtype=compute).expand(batch, -1)  # (batch, vocab)
    u = d @ unembed_weight.to(compute)  # (batch, d_model): W_U d
    unembed_bias = _vector(unembedding, "bias", unembed_weight.shape[0])
    bias = d @ unembed_bias.to(compute) if unembed_bias is not None else torch.zeros_like(u[:, 0])  # (batch,)
    w = None if norm is None else _vector(norm, "weight", u.shape[-1])
    # Each head's result is reduced as its layer runs, before the norm's form is known: its dots with
    # w ⊙ u and u (the weight w or 1 + w) and its sum (the mean a LayerNorm removes).
    probes = torch.stack([u if w is None else u * w.to(compute), u, torch.ones_like(u)], dim=1)  # (batch, 3, d)
    reduced, x, normed, logits, output = _run(handle, kwargs, selection, probes)

    frozen = _freeze(norm, stream.final.name, x, normed)
    g = u if frozen.weight is None else u * (frozen.weight.to(compute) + frozen.offset)  # (batch, d): w ⊙ u
    centre = g.mean(-1) if frozen.centred else torch.zeros_like(g[:, 0])  # P(c) · g = c · g − mean(g) Σ c
    s = frozen.scale  # (batch, pos)
    parts = []
    for layer in selection:
        r = reduced[layer]  # (batch, head, pos, 3)
        dot = r[..., 1] if frozen.weight is None else r[..., 0] + frozen.offset * r[..., 1]
        parts.append(s[:, None] * (dot - centre[:, None, None] * r[..., 2]))
    per_head = torch.cat(parts, dim=1) if parts else torch.zeros(batch, 0, length, dtype=compute, device=x.device)
    whole = s * ((x * g[:, None]).sum(-1) - centre[:, None] * x.sum(-1))  # (batch, pos): the whole stream
    rest = whole - per_head.sum(dim=1)
    if frozen.bias is not None:
        bias = bias + u @ frozen.bias.to(compute)
    bias_term = bias[:, None].expand(batch, length)
    own = torch.einsum("bpv,bv->bp", logits.to(compute), d)  # the unembedding's output along d
    error = float((per_head.sum(1) + rest + bias_term - own)[:, columns].abs().max())

    def mean(t: Tensor) -> np.ndarray:
        return t[..., columns].mean(0).double().cpu().numpy()

    tokens = handle.tokens({"input_ids": kwargs["decoder_input_ids"]} if "decoder_input_ids" in kwargs else kwargs)
    return LogitAttribution(
        heads=[(layer, h) for layer, hs in selection.items() for h in hs], positions=columns,
        contributions=mean(per_head), rest=mean(rest), bias=mean(bias_term), logit_diff=mean(own), direction=label,
        norm=frozen.description, tokens=None if not tokens else [tokens[0][p] for p in columns],
        length=length, batch=batch, error=error, note=_after_unembedding(handle, output, d, own))


def _writing(selection: dict[int, list[int]], writers: Sequence[AttentionSite], *,
             every: bool) -> dict[int, list[int]]:
    """The selected heads that write the stream the output reads (an encoder-decoder's decoder heads; ``every``:
    the others left out, else refused).

    Raises:
        ValueError: heads selected that write another stream (an encoder's).
    """
    layers = {site.layer for site in writers}
    others = sorted(layer for layer in selection if layer not in layers)
    if others and not every:
        raise ValueError(f"layers {others} write the encoder's stream, which reaches the logits only through "
                         f"cross-attention: they have no direct path to them; select the decoder's heads (layers "
                         f"{sorted(layers)})")
    return {layer: heads for layer, heads in selection.items() if layer in layers}


def _run(handle: HeadedModel, kwargs: dict[str, Any], selection: dict[int, list[int]],
         probes: Tensor) -> tuple[dict[int, Tensor], Tensor, Tensor | None, Tensor, Any]:
    """One forward: per layer the selected heads' results dotted with ``probes`` ``(batch, head, pos, 3)``, the
    final stream ``(batch, pos, d_model)`` (in ``probes``' dtype), the final norm's output, the unembedding's
    output and the model's output."""
    stream = stream_of(handle, kwargs)
    reduced: dict[int, Tensor] = {}

    def sink(layer: int, out: TapOutput) -> None:
        assert out.result is not None
        if out.result.shape[-1] != probes.shape[-1]:
            raise ValueError(f"{handle.architecture}: layer {layer}'s heads write {out.result.shape[-1]} features "
                             f"and the output reads {probes.shape[-1]}: a projection between them is not supported")
        reduced[layer] = torch.einsum("bhpd,bkd->bhpk", out.result.to(probes.dtype), probes)

    seen: dict[str, Tensor] = {}
    assert stream.unembedding is not None
    hooks = [stream.unembedding.register_forward_hook(_keeper(seen, "logits"))]
    if stream.final_norm is not None:
        hooks.append(stream.final_norm.register_forward_hook(_keeper(seen, "normed")))
    record: dict[int | str, Tensor] = {}
    try:
        with stream.hooked(record=record), tapped(handle.sites, selection, ("result",), sink), \
                handle.running(grad=False) as net:
            output = net(**kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return reduced, record["final"].to(probes.dtype), seen.get("normed"), seen["logits"], output


def plot_logit_attribution(result: LogitAttribution, path: str | Path, *, position: int | None = None,
                           by_position: bool = False) -> Path:
    """A heatmap of the contributions as a PNG: layer × head at one position (``LogitAttribution.column``'s;
    default the last read), or head × every position read with ``by_position``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    if not by_position:
        table = result.table(position)
        values, rows, columns = table.grid("contribution"), [f"L{layer}" for layer in table.layers], None
        at = result.positions[result.column(position)]
        token = f" {result.tokens[result.column(position)]!r}" if result.tokens else ""
        title, xlabel, ylabel = f"position {at}{token}", "head", "layer"
    else:
        values, rows = result.contributions, [head_label(*h) for h in result.heads]
        columns = [str(p) if not result.tokens else f"{p} {t}" for p, t in zip(result.positions,
                                                                               result.tokens or result.positions)]
        title, xlabel, ylabel = "every position read", "position", "head"
    limit = float(np.nanmax(np.abs(values))) if np.size(values) else 1.0
    fig = Figure(figsize=(max(4.0, 0.35 * values.shape[1] + 2), max(3.0, 0.22 * values.shape[0] + 1.5)),
                 layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, cmap="RdBu", vmin=-(limit or 1.0), vmax=limit or 1.0, aspect="auto")
    ax.set_yticks(range(len(rows)), rows, fontsize="small")
    if columns is not None:
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"direct logit attribution, {title}", fontsize="small")
    fig.colorbar(image, ax=ax, label=result.direction)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


@dataclass(frozen=True)
class _FrozenNorm:
    """The final norm as an affine map of the stream on one run: ``scale · P(x) ⊙ (weight + offset) + bias``."""

    centred: bool
    offset: float
    weight: Tensor | None  # the module's weight (offset not added), None for 1
    bias: Tensor | None
    scale: Tensor  # (batch, pos)
    description: str


def _freeze(norm: nn.Module | None, name: str, x: Tensor, y: Tensor | None) -> _FrozenNorm:
    """The form of ``norm`` whose reconstruction from ``x`` matches ``y``, its output on this run."""
    if norm is None:
        return _FrozenNorm(False, 0.0, None, None, torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device),
                           "none: the unembedding reads the stream")
    assert y is not None
    kind = type(norm).__name__
    d_model = x.shape[-1]
    weight, bias = _vector(norm, "weight", d_model), _vector(norm, "bias", d_model)
    target = y.to(x.dtype)
    peak = float(target.abs().max()) or 1.0
    tolerance = max(TOLERANCE, 8 * torch.finfo(y.dtype).eps)
    rms_first = isinstance(norm, nn.RMSNorm) or "rms" in kind.lower()  # breaks a tie (a stream of mean 0)
    forms = [(False, 0.0), (False, 1.0), (True, 0.0), (True, 1.0)] if rms_first else \
        [(True, 0.0), (True, 1.0), (False, 0.0), (False, 1.0)]
    tried: dict[str, float] = {}  # form -> its smallest relative error
    epsilons = _epsilons(norm, y.dtype)
    for centred, offset in forms:
        if weight is None and offset:
            continue
        form = ("LayerNorm (mean removed)" if centred else "RMSNorm") + \
            ("" if weight is None else ", weight" if not offset else ", 1 + weight") + \
            (", bias" if bias is not None else "")
        xc = x - x.mean(-1, keepdim=True) if centred else x
        for eps in epsilons:
            scale = torch.rsqrt(xc.pow(2).mean(-1) + eps)  # (batch, pos)
            out = xc * scale[..., None]
            if weight is not None:
                out = out * (weight.to(x.dtype) + offset)
            if bias is not None:
                out = out + bias.to(x.dtype)
            relative = float((out - target).abs().max()) / peak
            if relative <= tolerance:
                return _FrozenNorm(centred, offset, weight, bias, scale,
                                   f"{name} ({kind}): {form}, eps {eps:.3g}; scale frozen from the run")
            tried[form] = min(relative, tried.get(form, math.inf))
    eps_text = " or ".join(f"{eps:.3g}" for eps in epsilons)
    raise ValueError(f"the final norm {name} ({kind}) has no form headlab can freeze: no reconstruction from its "
                     f"input matches its output within {tolerance:.0e} relative (tried, with eps {eps_text}: "
                     + "; ".join(f"{form}: {error:.1e}" for form, error in tried.items()) + ")")


def _epsilons(norm: nn.Module, dtype: torch.dtype) -> list[float]:
    """The norm's eps as it names it, or common values when it names none."""
    for attribute in ("eps", "variance_epsilon", "epsilon"):
        if hasattr(norm, attribute):
            value = getattr(norm, attribute)
            if isinstance(value, (int, float)):
                return [float(value)]
            if value is None:  # torch's RMSNorm: the dtype's eps
                return [torch.finfo(dtype).eps]
    return [1e-5, 1e-6, 1e-12, 1e-8]


def _vector(module: nn.Module, name: str, size: int) -> Tensor | None:
    value = getattr(module, name, None)
    return value.detach() if isinstance(value, Tensor) and tuple(value.shape) == (size,) else None


def _keeper(seen: dict[str, Tensor], key: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        out = output if isinstance(output, Tensor) else output[0]
        seen[key] = out.detach()
    return hook


def _batch_and_length(kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """Items and positions of a forward's inputs; a padded batch refused."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, Tensor) and not bool(mask.bool().all()):
        raise ValueError("the batch is padded (its attention_mask has zeros): a position would be a different token "
                         "in each item, and padding a logit no one reads; give texts of one token length, or one text")
    first = kwargs.get("decoder_input_ids", kwargs.get("input_ids"))  # an encoder-decoder's logits: its decoder's
    if not isinstance(first, Tensor):
        first = next((v for v in kwargs.values() if isinstance(v, Tensor) and v.dim() >= 2), None)
    if first is None or first.dim() < 2:
        raise ValueError(f"cannot tell the batch and positions of the inputs {list(kwargs)}: expected a (batch, pos, "
                         "...) tensor")
    return int(first.shape[0]), int(first.shape[1])


def _positions(positions: int | Sequence[int] | None, length: int) -> list[int]:
    if positions is None:
        return list(range(length))
    given = [positions] if isinstance(positions, int) else list(positions)
    wrong = [p for p in given if isinstance(p, bool) or not isinstance(p, int) or not -length <= p < length]
    if wrong or not given:
        raise ValueError(f"positions={positions!r}: expected positions in [-{length}, {length}) of the input")
    return sorted({p % length for p in given})


def _direction(handle: HeadedModel, direction: Direction, *, vocab: int, batch: int) -> tuple[Tensor, str]:
    """``(batch | 1, vocab)`` and the direction in words."""
    if isinstance(direction, Tensor):
        if direction.dim() not in (1, 2) or direction.shape[-1] != vocab or (
                direction.dim() == 2 and direction.shape[0] != batch):
            raise ValueError(f"a direction tensor must be (vocab,) = ({vocab},) or (batch, vocab) = ({batch}, {vocab});"
                             f" got {tuple(direction.shape)}")
        return direction.detach().reshape(-1, vocab).double(), "logits · direction"
    if not isinstance(direction, (tuple, list)) or len(direction) != 2:
        raise ValueError(f"direction={direction!r}: expected (answer, wrong) tokens or a tensor over the vocabulary")
    ids = [_ids(handle, side, vocab=vocab, batch=batch) for side in direction]
    rows = max(len(ids[0]), len(ids[1]))
    d = torch.zeros(rows, vocab, dtype=torch.float64)
    for row in range(rows):
        d[row, ids[0][row % len(ids[0])]] += 1.0
        d[row, ids[1][row % len(ids[1])]] -= 1.0
    names = [_name(side) for side in direction]
    return d, f"logit({names[0]}) − logit({names[1]})"


def _ids(handle: HeadedModel, side: Token | Sequence[Token], *, vocab: int, batch: int) -> list[int]:
    tokens = [side] if isinstance(side, (int, str)) else list(side)
    if len(tokens) not in (1, batch):
        raise ValueError(f"{side!r}: give one token for the batch or one per item ({batch}); got {len(tokens)}")
    ids = []
    for token in tokens:
        if isinstance(token, str):
            if handle.tokenizer is None:
                raise ValueError(f"token {token!r} is a text and this {handle.architecture} has no tokenizer: give "
                                 "token ids, or headlab.attach(model, tokenizer=...)")
            pieces = handle.tokenizer(token, add_special_tokens=False)["input_ids"]
            if len(pieces) != 1:
                raise ValueError(f"token {token!r} is {len(pieces)} tokens for this tokenizer ({pieces}); give one "
                                 "token (a leading space often matters) or its id")
            token = pieces[0]
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise ValueError(f"token {token!r}: expected an id in [0, {vocab}) or a one-token text")
        ids.append(int(token))
    return ids


def _name(side: Token | Sequence[Token]) -> str:
    if isinstance(side, (int, str)):
        return repr(side)
    return "per item"


def _after_unembedding(handle: HeadedModel, output: Any, d: Tensor, own: Tensor) -> str:
    """What the model does to the logits after its unembedding, in words ("" when they are its output)."""
    logits = getattr(output, "logits", None)
    if not isinstance(logits, Tensor) or logits.shape[:-1] != own.shape:
        return ""
    final = torch.einsum("bpv,bv->bp", logits.to(d.dtype), d)
    if torch.allclose(final, own, rtol=TOLERANCE, atol=TOLERANCE * (float(own.abs().max()) or 1.0)):
        return ""
    cap = getattr(getattr(handle.model, "config", None), "final_logit_softcapping", None)
    why = f"soft-caps them (final_logit_softcapping={cap})" if cap else "changes them"
    return (f"the model {why} after the unembedding: attributed are the logits before that "
            f"(output {display.short(float(final[:, -1].mean()))} at the last position)")
