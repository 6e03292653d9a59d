"""Exact weight exchange with ``torch.nn.MultiheadAttention``, and a parity check against it.

headlab layers are batch-first; a torch layer with ``batch_first=False`` carries the same
weights, only its inputs are transposed. The wide projection's state_dict names are torch's
(``in_proj_weight`` or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, ``in_proj_bias``,
``out_proj.weight``, ``out_proj.bias``), so the copy is a strict ``load_state_dict``; torch's
``add_bias_kv`` parameters ``bias_k``, ``bias_v`` ``(1, 1, embed_dim)`` become the layer's
``extra_kv.bias_k``, ``extra_kv.bias_v`` ``(n_heads, d_head)`` (``headlab.layer.extra_kv``).

Where headlab and torch differ, on purpose:
- Attention weights in training with dropout. torch's ``need_weights`` returns the weights after
  dropout (zeros where dropped, the rest scaled by 1/(1 − p)); headlab's ``return_pattern``
  returns the attention distribution before dropout (rows sum to 1), the same in training and
  evaluation. Outputs agree: under the same random state, torch's weights are exactly
  ``F.dropout(pattern, p)`` of headlab's pattern, and its output is headlab's.
- A query row that sees no key: torch gives NaN, headlab a zero pattern and a zero z. (With
  ``add_bias_kv`` or ``add_zero_attn`` no row is blind: both see the extra positions.)
- ``static_k`` / ``static_v``: arguments of ``torch.nn.functional.multi_head_attention_forward``
  only. ``nn.MultiheadAttention`` never passes them, so no module ``from_torch`` accepts uses
  them, and headlab's layer has no argument that replaces its projected keys: its kv cache
  holds keys the layer projected itself, for decoding. What headlab offers instead is its
  functional core, which takes per-head keys and values as they are; ``attend_static`` composes
  it with a layer's query and output projections and gives torch's functional result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.functional import attend
from headlab.layer.masks import build_mask


def from_torch(mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """A headlab layer with exactly the weights of ``mha`` (same device and dtype).

    Args:
        mha: a torch layer, batch_first either way, any kdim/vdim, with or without bias,
            add_bias_kv and add_zero_attn.

    Returns:
        The layer; for the same (batch-first) inputs and masks its outputs and per-head
        attention weights (``return_pattern=True``; torch's ``average_attn_weights=True`` is
        their mean over heads) equal torch's, the add_bias_kv and add_zero_attn positions
        included as the last key positions. In training with dropout the pattern is taken
        before dropout, torch's weights after it (see the module docstring). torch's
        functional-only ``static_k`` / ``static_v`` have no counterpart in a module; see
        ``attend_static``.

    Raises:
        TypeError: ``mha`` is not an nn.MultiheadAttention.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"expected a torch.nn.MultiheadAttention, got {type(mha).__name__}")
    config = AttentionConfig(
        d_model=mha.embed_dim, n_heads=mha.num_heads, kdim=mha.kdim, vdim=mha.vdim,
        bias=mha.in_proj_bias is not None, dropout=float(mha.dropout),
        add_bias_kv=mha.bias_k is not None, add_zero_attn=bool(mha.add_zero_attn),
    )
    weight = mha.out_proj.weight
    layer = MultiHeadAttention(config).to(device=weight.device, dtype=weight.dtype)
    state = mha.state_dict()
    # torch's (1, 1, n_heads·d_head), heads contiguous, as headlab's (n_heads, d_head)
    extra: dict[str, Tensor] = {name: state.pop(name).view(config.n_heads, config.d_head)
                                for name in ("bias_k", "bias_v") if name in state}
    layer.projection.load_state_dict(state)  # same names, strict: nothing left out
    if extra:
        assert layer.extra_kv is not None  # torch's bias_k: add_bias_kv=True, which built them
        layer.extra_kv.load_state_dict(extra)
    return layer.train(mha.training)


def to_torch(layer: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` with exactly the weights of ``layer``.

    Args:
        layer: a headlab layer in nn.MultiheadAttention's reach (see Raises).
        batch_first: the torch layer's input layout.

    Returns:
        The torch layer, on the layer's device and dtype.

    Raises:
        ValueError: the layer has a feature torch's layer lacks, named in the message.
    """
    c = layer.config
    unsupported = {
        "projection": (c.projection, "wide"),
        "n_kv_heads": (c.n_kv_heads, c.n_heads),
        "d_head": (c.d_head, c.d_model // c.n_heads),
        "d_head_v": (c.d_head_v, c.d_head),
        "rotary": (c.rotary, False),
        "talking_heads": (c.talking_heads, False),
        "causal": (c.causal, False),
    }
    for name, (value, needed) in unsupported.items():
        if value != needed or (name == "d_head" and c.d_head * c.n_heads != c.d_model):
            raise ValueError(
                f"{name}={value!r}: nn.MultiheadAttention only has {name}={needed!r}"
                + (" (pass a causal attn_mask at call time instead)" if name == "causal" else "")
            )
    if c.scale is not None and c.scale != c.d_head**-0.5:
        raise ValueError(f"scale={c.scale}: nn.MultiheadAttention always scales by 1/sqrt(d_head)")
    weight = layer.projection.out_proj.weight
    mha = nn.MultiheadAttention(
        c.d_model, c.n_heads, dropout=c.dropout, bias=c.bias, add_bias_kv=c.add_bias_kv,
        add_zero_attn=c.add_zero_attn, kdim=c.kdim, vdim=c.vdim, batch_first=batch_first,
        device=weight.device, dtype=weight.dtype,
    )
    state = layer.projection.state_dict()
    if c.add_bias_kv:
        state |= {name: getattr(layer.extra_kv, name).detach().reshape(1, 1, -1) for name in ("bias_k", "bias_v")}
    mha.load_state_dict(state)
    return mha.train(layer.training)


def attend_static(
    layer: MultiHeadAttention,
    query: Tensor,
    static_k: Tensor,
    static_v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    return_pattern: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attend from ``query`` to precomputed per-head keys and values: torch's functional ``static_k``/``static_v``.

    ``torch.nn.functional.multi_head_attention_forward(..., static_k=, static_v=)`` projects
    only the query and attends to the keys and values given, already split into heads. Here
    ``layer.projection`` gives q, ``headlab.layer.functional.attend`` attends and
    ``layer.projection.merge`` applies W_O; the zero position of ``add_zero_attn`` is appended
    after the static keys, as torch does (torch refuses ``add_bias_kv`` with static keys).
    Persistent head interventions (``set_head_affine``) are not applied: torch has none.

    Args:
        layer: a layer without rotary positions (static keys carry none).
        query: ``(batch, query_pos, d_model)``.
        static_k: ``(batch·kv_heads, key_pos, qk_dim)``, torch's layout (batch-major).
        static_v: ``(batch·kv_heads, key_pos, d_head_v)``.
        key_padding_mask, attn_mask: as for ``MultiHeadAttention.forward``, over key_pos.
        return_pattern: also return every head's pattern.

    Returns:
        ``(output (batch, query_pos, d_model), pattern (batch, n_heads, query_pos, key_pos [+ 1]) or None)``.

    Raises:
        ValueError: the layer uses add_bias_kv or rotary positions, or the shapes do not fit.
    """
    c = layer.config
    if c.add_bias_kv or c.rotary:
        raise ValueError(f"add_bias_kv={c.add_bias_kv}, rotary={c.rotary}: static keys take neither a learned "
                         "extra key (torch refuses it too) nor rotary positions")
    variant = type(layer.projection)
    batch, q_len = query.shape[0], query.shape[1]
    kv_heads = variant.kv_heads(c)
    if static_k.dim() != 3 or static_k.shape[0] != batch * kv_heads or static_k.shape[2] != variant.qk_dim(c) or (
            static_v.shape != (*static_k.shape[:2], c.d_head_v)):
        raise ValueError(f"static_k {tuple(static_k.shape)} and static_v {tuple(static_v.shape)} must be "
                         f"(batch·kv_heads, key_pos, d) = ({batch * kv_heads}, key_pos, {variant.qk_dim(c)}) "
                         f"and (…, {c.d_head_v})")
    k_len = static_k.shape[1]
    k = static_k.view(batch, kv_heads, k_len, -1)
    v = static_v.view(batch, kv_heads, k_len, -1)
    # The projection maps (query, key, value) together; one dummy key position keeps the cost to q's.
    q = layer.projection(query, query.new_zeros(batch, 1, c.kdim), query.new_zeros(batch, 1, c.vdim))[0]
    mask = build_mask(key_padding_mask=key_padding_mask, attn_mask=attn_mask, causal=False, batch=batch,
                      n_heads=c.n_heads, q_len=q_len, k_len=k_len, dtype=query.dtype, device=query.device,
                      extra_keys=0 if layer.extra_kv is None else layer.extra_kv.count)
    if layer.extra_kv is not None:
        k, v = layer.extra_kv(k, v)
    z, pattern = attend(q, k, v, mask, scale=c.softmax_scale, dropout_p=c.dropout if layer.training else 0.0,
                        pattern_heads=list(range(c.n_heads)) if return_pattern else None, kv_index=layer.kv_index)
    return layer.projection.merge(z), pattern


@dataclass(frozen=True)
class ParityCase:
    """One comparison of a headlab layer converted by ``from_torch`` with its torch original.

    Attributes:
        name: what the case exercises.
        settings: sizes and options of the case.
        output_max_abs: max |headlab − torch| over outputs, fast path (need_weights=False)
            and pattern path (need_weights=True), on the query rows torch leaves finite.
        weights_max_abs: max |headlab pattern − torch unaveraged attention weights| on those rows.
        reference_max_abs: max |headlab float32 − float64 reference| over outputs (torch's
            explicit math run in float64); on rows that see no key (NaN in torch), headlab's
            output against the output bias b_O, since such a row's z is zero.
        tolerance: the bound every difference must stay under.
        passed: every difference is under the tolerance, and rows that see no key have an
            all-zero pattern.
    """

    name: str
    settings: dict[str, object]
    output_max_abs: float
    weights_max_abs: float
    reference_max_abs: float
    tolerance: float
    passed: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


_TOLERANCE = 1e-5


def parity_suite(*, seed: int = 0, quick: bool = False) -> list[ParityCase]:
    """Compare headlab with nn.MultiheadAttention over a grid of shapes, masks and options.

    The grid covers self- and cross-attention, every mask form (bool and float key padding,
    2-D, per-head 3-D and 4-D attn_mask, a fully padded sequence), no bias, batch_first=False,
    one head, and add_bias_kv / add_zero_attn (with and without masks, cross-attention, and a
    fully padded sequence, where both layers attend to the extra positions only).

    Args:
        seed: seeds weights, inputs and masks.
        quick: shorter sequences.

    Returns:
        One ``ParityCase`` per grid point.
    """
    generator = torch.Generator().manual_seed(seed)
    q_len, k_len = (7, 9) if quick else (33, 41)
    grid: list[tuple[str, dict[str, object]]] = [
        ("self-attention", dict(d_model=64, n_heads=8)),
        ("self-attention · key padding (bool)", dict(d_model=48, n_heads=6, padding="bool")),
        ("self-attention · no bias · causal attn_mask (bool)", dict(d_model=32, n_heads=4, bias=False, attn="causal")),
        ("self-attention · per-head float attn_mask · float key padding",
         dict(d_model=40, n_heads=5, attn="float3d", padding="float")),
        ("self-attention · (batch, heads, q, k) bool attn_mask", dict(d_model=24, n_heads=3, attn="bool4d")),
        ("cross-attention kdim=24 vdim=40 · key padding",
         dict(d_model=32, n_heads=4, kdim=24, vdim=40, padding="bool")),
        ("cross-attention, equal widths · batch_first=False", dict(d_model=32, n_heads=2, batch_first=False)),
        ("self-attention · a fully padded sequence (torch: NaN, headlab: 0)",
         dict(d_model=32, n_heads=4, padding="dead")),
        ("one head", dict(d_model=16, n_heads=1, padding="bool")),
        ("add_bias_kv · key padding (bool)", dict(d_model=32, n_heads=4, add_bias_kv=True, padding="bool")),
        ("add_zero_attn · causal attn_mask (bool)", dict(d_model=32, n_heads=4, add_zero_attn=True, attn="causal")),
        ("add_bias_kv + add_zero_attn · cross-attention kdim=24 vdim=40 · per-head float attn_mask",
         dict(d_model=32, n_heads=4, kdim=24, vdim=40, add_bias_kv=True, add_zero_attn=True, attn="float3d")),
        ("add_bias_kv + add_zero_attn · a fully padded sequence (both: only the extra positions)",
         dict(d_model=24, n_heads=3, add_bias_kv=True, add_zero_attn=True, padding="dead")),
    ]
    return [_parity_case(name, opts, q_len=q_len, k_len=k_len, generator=generator) for name, opts in grid]


def _parity_case(name: str, opts: dict[str, Any], *, q_len: int, k_len: int,
                 generator: torch.Generator) -> ParityCase:
    d_model, n_heads = int(opts["d_model"]), int(opts["n_heads"])
    kdim, vdim = int(opts.get("kdim", d_model)), int(opts.get("vdim", d_model))
    cross = "kdim" in opts or opts.get("batch_first") is False
    batch_first = bool(opts.get("batch_first", True))
    batch = 3
    k_len = k_len if cross else q_len

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator)

    torch_layer = nn.MultiheadAttention(d_model, n_heads, bias=bool(opts.get("bias", True)),
                                        add_bias_kv=bool(opts.get("add_bias_kv", False)),
                                        add_zero_attn=bool(opts.get("add_zero_attn", False)), kdim=kdim,
                                        vdim=vdim, batch_first=batch_first).eval()
    with torch.no_grad():
        for param_name, p in torch_layer.named_parameters():  # torch starts biases at zero; make them count
            if "bias" in param_name:
                p.copy_(randn(*p.shape) * 0.1)
    query = randn(batch, q_len, d_model)
    key = randn(batch, k_len, kdim) if cross else query
    value = randn(batch, k_len, vdim) if cross else query
    masks = _parity_masks(opts, batch, n_heads, q_len, k_len, randn)

    layer = from_torch(torch_layer).eval()
    with torch.no_grad():
        fast = layer(query, key, value, **masks)
        full = layer(query, key, value, **masks, return_pattern=True)
        t_fast = _torch_call(torch_layer, query, key, value, masks, need_weights=False)[0]
        t_out, t_weights = _torch_call(torch_layer, query, key, value, masks, need_weights=True)
        ref = _torch_call(torch_layer.double(), query.double(), key.double(), value.double(),
                          {k: (v.double() if v.is_floating_point() else v) for k, v in masks.items()},
                          need_weights=True)[0]
    live = torch.isfinite(t_out).all(dim=-1)  # (batch, query_pos): rows torch answers
    out_diff = max(_max_abs(fast[live] - t_fast[live]), _max_abs(full.output[live] - t_out[live]))
    pattern = full.pattern
    assert pattern is not None and t_weights is not None  # return_pattern=True, need_weights=True
    w_live = live[:, None, :].expand_as(pattern[..., 0])
    weights_diff = _max_abs(pattern[w_live] - t_weights[w_live])
    # A row that sees no key has z = 0, so its output is the output bias alone.
    b_O = layer.b_O if layer.b_O is not None else torch.zeros(d_model)
    ref_diff = max(_max_abs(fast[live] - ref[live].float()), _max_abs(fast[~live] - b_O))
    dead_zero = bool((pattern[~w_live] == 0).all())
    settings = dict(batch=batch, q_len=q_len, k_len=k_len, kdim=kdim, vdim=vdim, batch_first=batch_first,
                    **{k: v for k, v in opts.items() if k not in ("kdim", "vdim", "batch_first")})
    passed = max(out_diff, weights_diff, ref_diff) < _TOLERANCE and dead_zero
    return ParityCase(name, settings, out_diff, weights_diff, ref_diff, _TOLERANCE, passed)


def _parity_masks(opts: dict[str, object], batch: int, n_heads: int, q_len: int, k_len: int,
                  randn: Callable[..., Tensor]) -> dict[str, Tensor]:
    masks: dict[str, Tensor] = {}
    padding = opts.get("padding")
    if padding is not None:
        pad = torch.arange(k_len)[None, :] >= (k_len - torch.arange(batch)[:, None] * 2)  # ragged ends
        if padding == "dead":
            pad[1] = True
        masks["key_padding_mask"] = pad.float().masked_fill(pad, float("-inf")) if padding == "float" else pad
    attn = opts.get("attn")
    if attn == "causal":
        masks["attn_mask"] = torch.ones(q_len, k_len, dtype=torch.bool).triu(1)
    elif attn == "float3d":
        masks["attn_mask"] = randn(batch * n_heads, q_len, k_len)
    elif attn == "bool4d":
        masks["attn_mask"] = randn(batch, n_heads, q_len, k_len) > 1.0
    return masks


def _torch_call(mha: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
                masks: dict[str, Tensor], *, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """Call a torch layer on batch-first inputs and return batch-first outputs."""
    attn_mask = masks.get("attn_mask")
    if attn_mask is not None and attn_mask.dim() == 4:  # torch takes (batch·heads, q, k)
        attn_mask = attn_mask.flatten(0, 1)
    if not mha.batch_first:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    out, weights = mha(query, key, value, key_padding_mask=masks.get("key_padding_mask"), attn_mask=attn_mask,
                       need_weights=need_weights, average_attn_weights=False)
    return (out if mha.batch_first else out.transpose(0, 1)), weights


def _max_abs(x: Tensor) -> float:
    return float(x.detach().abs().max()) if x.numel() else 0.0
