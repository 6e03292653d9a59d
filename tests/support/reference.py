"""References the tests compare headlab with, each computed apart from the code under test.

- ``layer_reference``: MultiHeadAttention written head by head in float64. It reads only the
  layer's per-head weight views and config, and re-derives the mask semantics (nn.MultiheadAttention's,
  with its add_bias_kv / add_zero_attn positions appended after the keys and always allowed) and
  rotary (``rotate``, as complex rotation) without headlab code.
- ``model_reference``: an attached model's per-head patterns, z and results for one text, from
  transformers' ``output_attentions`` and a hook on the output projection, in float64.
- ``captured_patterns``: float patterns straight from a capture, to check what the viewer encodes
  and the browser shows.
- ``check_taps``: an attached model's tapped z, pattern, v and results against what its forward computes
  (the output projection's input and output, by a hook), for any input (pixels, source and target …).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn


def rotate(x: Tensor, positions: Tensor, rotary_dim: int, base: float) -> Tensor:
    """Rotate pairs (i, i + rotary_dim/2) of x (pos, d) by angle pos · base^(-2i/rotary_dim)."""
    half = rotary_dim // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / rotary_dim)
    angle = positions.double()[:, None] * freq[None, :]
    pairs = torch.complex(x[:, :half], x[:, half:rotary_dim]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((pairs.real, pairs.imag, x[:, rotary_dim:]), dim=1)


def layer_reference(
    layer,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    causal: bool | None = None,
    head_mask: Tensor | None = None,
    query_start: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (output (B, L, d_model), patterns (B, H, L, S + extra), result (B, H, L, d_model)) in float64.

    ``extra``: the learned (add_bias_kv) and zero (add_zero_attn) key positions after the S keys.

    ``query_start``: rotary position of the first query (keys start at 0); when decoding
    with a cache, pass all keys so far and query_start = number of cached positions.
    """
    c = layer.config
    key = query if key is None else key
    value = key if value is None else value
    causal = c.causal if causal is None else causal
    query, key, value = query.double(), key.double(), value.double()
    B, L, _ = query.shape
    S = key.shape[1]
    H = c.n_heads
    scale = c.scale if c.scale is not None else 1 / math.sqrt(c.d_head)
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O))

    def bias(b):
        return None if b is None else b.detach().double()

    b_Q, b_K, b_V, b_O = bias(layer.b_Q), bias(layer.b_K), bias(layer.b_V), bias(layer.b_O)

    # Talking heads (Shazeer et al. 2020): logits and weights mixed across heads; identity otherwise.
    core = getattr(layer, "core", None)
    eye = torch.eye(H, dtype=torch.float64)
    P_logit = core.logit_mixing.detach().double() if hasattr(core, "logit_mixing") else eye
    P_weight = core.weight_mixing.detach().double() if hasattr(core, "weight_mixing") else eye

    extra = getattr(layer, "extra_kv", None)
    bias_k = bias_v = None
    if extra is not None and extra.bias_k is not None:
        bias_k, bias_v = extra.bias_k.detach().double(), extra.bias_v.detach().double()
    zero_kv = getattr(c, "add_zero_attn", False)

    patterns: list[list[Tensor]] = [[None] * H for _ in range(B)]
    result: list[list[Tensor]] = [[None] * H for _ in range(B)]
    for b in range(B):
        logits, adds, values = [], [], []
        for h in range(H):
            kv = c.kv_head_of[h]
            q = query[b] @ W_Q[h] + (0 if b_Q is None else b_Q[h])
            k = key[b] @ W_K[kv] + (0 if b_K is None else b_K[kv])
            values.append(value[b] @ W_V[kv] + (0 if b_V is None else b_V[kv]))
            if c.rotary:
                q_pos = torch.arange(L) + query_start
                q = rotate(q, q_pos, c.rotary_dim, c.rotary_base)
                k = rotate(k, torch.arange(S), c.rotary_dim, c.rotary_base)
            v = values[-1]
            if bias_k is not None:  # torch's add_bias_kv: one learned position, not rotated
                k, v = torch.cat([k, bias_k[kv][None]]), torch.cat([v, bias_v[kv][None]])
            if zero_kv:  # torch's add_zero_attn: one all-zero position
                k, v = torch.cat([k, torch.zeros_like(k[:1])]), torch.cat([v, torch.zeros_like(v[:1])])
            values[-1] = v
            add = torch.zeros(L, k.shape[0], dtype=torch.float64)  # what the masks add; extra positions stay 0
            for i in range(L):
                for j in range(S):
                    for m in _mask_entries(key_padding_mask, attn_mask, b, h, i, j, H):
                        add[i, j] = -math.inf if m.dtype == torch.bool and m else add[i, j] + (
                            0.0 if m.dtype == torch.bool else float(m))
                    if causal and j > i + (S - L):
                        add[i, j] = -math.inf
            logits.append((q @ k.T) * scale)
            adds.append(add)
        weights = []
        for h in range(H):
            scores = sum(P_logit[f, h] * logits[f] for f in range(H)) + adds[h]
            zero = torch.zeros(scores.shape[1], dtype=torch.float64)  # a row that sees no key: zero pattern, zero z
            weights.append(torch.stack([zero if torch.isneginf(row).all() else torch.softmax(row, dim=0)
                                        for row in scores]))
        for h in range(H):
            pattern = sum(P_weight[f, h] * weights[f] for f in range(H))
            z = pattern @ values[h]  # (L, d_head_v)
            if head_mask is not None:
                z = z * (head_mask[h] if head_mask.dim() == 1 else head_mask[b, h])
            patterns[b][h] = pattern
            result[b][h] = z @ W_O[h]
    patterns = torch.stack([torch.stack(p) for p in patterns])
    result = torch.stack([torch.stack(r) for r in result])
    output = result.sum(dim=1) + (0 if b_O is None else b_O)
    return output, patterns, result


def _mask_entries(key_padding_mask, attn_mask, b, h, i, j, H):
    """The mask values that apply to score (b, h, i, j)."""
    if key_padding_mask is not None:
        yield key_padding_mask[b, j]
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            yield attn_mask[i, j]
        elif attn_mask.dim() == 3:
            yield attn_mask[b * H + h, i, j]
        else:
            yield attn_mask[b if attn_mask.shape[0] > 1 else 0, h if attn_mask.shape[1] > 1 else 0, i, j]


def model_reference(model: nn.Module, ids: list[int]) -> list[dict[str, Tensor]]:
    """One unpadded item, layer by layer: every head's pattern, result and z, in float64.

    Computed apart from taps: the patterns are transformers' ``output_attentions`` of a float64
    copy, z is what its output projections receive (a pre-hook), each head's result z_h W_O[h].
    """
    from headlab.models import headed

    twin = copy.deepcopy(model).double()
    sites = headed(twin).sites
    z: dict[int, Tensor] = {}
    hooks = [site.out_proj.module.register_forward_pre_hook(
        lambda module, args, layer=site.layer: z.__setitem__(layer, args[0][0])) for site in sites]
    try:
        with torch.no_grad():
            out = twin(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for site in sites:
        per_head = z[site.layer].view(len(ids), site.n_heads, site.d_head_v).transpose(0, 1)  # (head, pos, d_head_v)
        result = torch.einsum("hqd,hdm->hqm", per_head, site.W_O.double())
        layers.append({"pattern": out.attentions[site.layer][0].float(), "z": per_head.float(),
                       "result": result.float()})
    return layers


class _Keep:
    def __init__(self) -> None:
        self.patterns: dict[int, torch.Tensor] = {}
        self.units: torch.Tensor | None = None

    def update(self, batch) -> None:
        n = int(batch.lengths[0])
        units, _ = batch.word_units()
        self.units = units[0, :n].clone()
        for layer, taken in batch.layers.items():
            self.patterns[layer] = taken.pattern[0, :, :n, :n].float().clone()


def captured_patterns(model, text: str) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """``({layer: (head, n, n) float32 patterns}, units (n,))`` of one text, every head."""
    from headlab.capture import capture

    keep = _Keep()
    capture(model, corpus=[text], consumers=[keep], progress=False)
    return keep.patterns, keep.units


def check_taps(handle, inputs) -> dict:
    """Tap every head's pattern, z, result and v on ``inputs`` and check, site by site, that z is the output
    projection's input head by head, that the pattern times v gives z, and that the results and the projection's
    bias sum to its output (float64 tolerances). Returns the cache."""
    import headlab

    calls: dict[int, list[tuple[Tensor, Tensor]]] = {}  # per output projection, its calls in order

    def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
        calls[id(module)].append((args[0], output))

    projections = {id(site.out_proj.module): site.out_proj.module for site in handle.sites}
    hooks = []
    for key, module in projections.items():
        calls[key] = []
        hooks.append(module.register_forward_hook(hook))
    try:
        cache = headlab.run_with_cache(handle, inputs, take=("pattern", "z", "result", "v"))
    finally:
        for each in hooks:
            each.remove()
    for site in handle.sites:  # a module run in several layers (ALBERT) gives its calls in layer order
        z_in, out = calls[id(site.out_proj.module)].pop(0)  # (batch, pos, heads · d_head_v), (batch, pos, d_model)
        z = z_in.unflatten(-1, (site.n_heads, site.d_head_v)).transpose(1, 2)
        torch.testing.assert_close(cache["z", site.layer], z, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cache["pattern", site.layer] @ cache["v", site.layer], z, rtol=1e-10, atol=1e-12)
        bias = site.out_proj.module.bias
        total = cache["result", site.layer].sum(dim=1) + (0 if bias is None else bias)
        torch.testing.assert_close(total, out, rtol=1e-10, atol=1e-12)
    return cache
