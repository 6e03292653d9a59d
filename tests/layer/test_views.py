"""The per-head weight views W_Q W_K W_V W_O and b_Q b_K b_V b_O.

They must have the documented shapes, be zero-copy views of the layer's parameters (so
writing through them edits the layer, for the one head written), and pass gradients back
to the parameters.
"""

from __future__ import annotations

import copy

import pytest
import torch

from headlab.layer import AttentionConfig, MultiHeadAttention

CONFIGS = [
    pytest.param({"d_model": 8, "n_heads": 2}, id="standard"),
    pytest.param({"d_model": 12, "n_heads": 4, "n_kv_heads": 2}, id="grouped-query"),
    pytest.param({"d_model": 12, "n_heads": 3, "n_kv_heads": 1}, id="multi-query"),
    pytest.param({"d_model": 8, "n_heads": 4, "n_kv_heads": 2, "kdim": 5, "vdim": 7, "d_head_v": 3}, id="cross"),
    pytest.param({"d_model": 8, "n_heads": 2, "bias": False}, id="no-bias"),
    pytest.param({"d_model": 6, "n_heads": 4, "d_head": 3, "d_head_v": 5}, id="d_head-independent"),
]

WEIGHTS = ["W_Q", "W_K", "W_V", "W_O"]
BIASES = ["b_Q", "b_K", "b_V", "b_O"]


def expected_shapes(c: AttentionConfig) -> dict[str, tuple[int, ...]]:
    return {
        "W_Q": (c.n_heads, c.d_model, c.d_head),
        "W_K": (c.n_kv_heads, c.kdim, c.d_head),
        "W_V": (c.n_kv_heads, c.vdim, c.d_head_v),
        "W_O": (c.n_heads, c.d_head_v, c.d_model),
        "b_Q": (c.n_heads, c.d_head),
        "b_K": (c.n_kv_heads, c.d_head),
        "b_V": (c.n_kv_heads, c.d_head_v),
        "b_O": (c.d_model,),
    }


def make_layer(kwargs, **extra) -> MultiHeadAttention:
    layer = MultiHeadAttention(AttentionConfig(**(kwargs | extra))).double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # biases start at zero; make every parameter non-trivial
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return layer


def inputs(layer: MultiHeadAttention, batch: int = 2, q_len: int = 3, k_len: int = 4):
    c = layer.config
    g = torch.Generator().manual_seed(1)

    def randn(*s):
        return torch.randn(s, generator=g, dtype=torch.float64)

    return randn(batch, q_len, c.d_model), randn(batch, k_len, c.kdim), randn(batch, k_len, c.vdim)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_view_shapes(kwargs):
    layer = make_layer(kwargs)
    c = layer.config
    for name, shape in expected_shapes(c).items():
        view = getattr(layer, name)
        if name in BIASES and not c.bias:
            assert view is None, name
        else:
            assert view.shape == shape, name
            assert view.dtype == torch.float64


def test_cross_attention_keeps_separate_weights():
    layer = make_layer({"d_model": 8, "n_heads": 2, "kdim": 5, "vdim": 7})
    p = layer.projection
    assert p.in_proj_weight is None
    assert p.q_proj_weight.shape == (8, 8) and p.k_proj_weight.shape == (8, 5) and p.v_proj_weight.shape == (8, 7)


def _address_range(t: torch.Tensor) -> tuple[int, int]:
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + last * t.element_size()


def _owner(view: torch.Tensor, layer: MultiHeadAttention) -> str | None:
    """The name of the parameter whose storage holds every element of ``view``, if any."""
    first, last = _address_range(view)
    for name, p in layer.named_parameters():
        storage = p.untyped_storage()
        start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        if start <= first and last < end:
            return name
    return None


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_views_are_zero_copy(kwargs):
    layer = make_layer(kwargs)
    owners = {}
    for name in WEIGHTS + BIASES:
        view = getattr(layer, name)
        if view is None:
            continue
        owners[name] = _owner(view, layer)
        assert owners[name] is not None, f"{name} is a copy, not a view of a parameter"
    assert owners["W_O"] == "projection.out_proj.weight"
    if "b_O" in owners:
        assert owners["b_O"] == "projection.out_proj.bias"
    if layer.config.kdim == layer.config.d_model == layer.config.vdim:  # fused in_proj_weight
        assert owners["W_Q"] == owners["W_K"] == owners["W_V"] == "projection.in_proj_weight"


def _heads_using(name: str, index: int, c: AttentionConfig) -> set[int]:
    if name in ("W_Q", "W_O", "b_Q"):
        return {index}
    return {h for h in range(c.n_heads) if c.kv_head_of[h] == index}  # key/value heads are shared


@pytest.mark.parametrize("kwargs", [p for p in CONFIGS if "no-bias" not in p.id])
@pytest.mark.parametrize("name", ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"])
def test_writing_a_view_changes_that_head_only(kwargs, name):
    # rotary makes b_K matter: without it a key bias shifts every score of a row equally.
    layer = make_layer(kwargs, rotary=True, rotary_dim=2)
    c = layer.config
    query, key, value = inputs(layer)
    before = layer(query, key, value, return_result=True)
    for index in range(getattr(layer, name).shape[0]):
        with torch.no_grad():
            getattr(layer, name)[index].add_(torch.randn(getattr(layer, name)[index].shape, dtype=torch.float64))
        after = layer(query, key, value, return_result=True)
        changed = _heads_using(name, index, c)
        for h in range(c.n_heads):
            same = torch.allclose(after.result[:, h], before.result[:, h], atol=1e-12, rtol=0)
            assert same != (h in changed), f"{name}[{index}] write: head {h} {'unchanged' if not same else 'changed'}?"
        before = after


def test_writing_b_O_shifts_the_output_only():
    layer = make_layer({"d_model": 8, "n_heads": 2})
    query, key, value = inputs(layer)
    before = layer(query, key, value, return_result=True)
    delta = torch.randn(8, dtype=torch.float64)
    with torch.no_grad():
        layer.b_O.add_(delta)
    after = layer(query, key, value, return_result=True)
    torch.testing.assert_close(after.result, before.result, atol=0, rtol=0)
    torch.testing.assert_close(after.output, before.output + delta, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_parameter_changes_show_in_the_views(kwargs):
    layer = make_layer(kwargs)
    views = {name: getattr(layer, name) for name in WEIGHTS + BIASES if getattr(layer, name) is not None}
    copies = {name: v.detach().clone() for name, v in views.items()}
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(-2.0)
    for name, view in views.items():  # the views taken before the edit see it
        torch.testing.assert_close(view.detach(), -2.0 * copies[name], atol=0, rtol=0)


def _grads_as_layer(layer: MultiHeadAttention) -> MultiHeadAttention:
    """A copy of ``layer`` whose parameters hold ``layer``'s gradients (zeros where none)."""
    clone = copy.deepcopy(layer)
    with torch.no_grad():
        for p, q in zip(layer.parameters(), clone.parameters(), strict=True):
            q.copy_(torch.zeros_like(p) if p.grad is None else p.grad)
    return clone


@pytest.mark.parametrize("kwargs", CONFIGS)
@pytest.mark.parametrize("name", WEIGHTS + BIASES)
def test_gradients_flow_through_views(kwargs, name):
    layer = make_layer(kwargs)
    view = getattr(layer, name)
    if view is None:
        assert name in BIASES and not layer.config.bias
        return
    assert view.requires_grad
    upstream = torch.randn(view.shape, dtype=torch.float64)
    (view * upstream).sum().backward()
    grads = _grads_as_layer(layer)
    # The gradient lands exactly where the view reads, and nowhere else.
    torch.testing.assert_close(getattr(grads, name).detach(), upstream, atol=0, rtol=0)
    total = sum(p.grad.square().sum() for p in layer.parameters() if p.grad is not None)
    torch.testing.assert_close(total, upstream.square().sum(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_gradient_of_a_loss_on_the_qk_circuit(kwargs):
    # d/dW_Q[h] ||W_Q[h] W_K[kv]ᵀ||² = 2 W_Q[h] W_K[kv]ᵀ W_K[kv]; W_V, W_O and biases get none.
    layer = make_layer(kwargs)
    c = layer.config
    layer.QK.AB.square().sum().backward()
    grads = _grads_as_layer(layer)
    W_Q, W_K = layer.W_Q.detach(), layer.W_K.detach()
    for h in range(c.n_heads):
        kv = c.kv_head_of[h]
        expected = 2 * W_Q[h] @ W_K[kv].T @ W_K[kv]
        torch.testing.assert_close(grads.W_Q[h].detach(), expected, atol=1e-10, rtol=0)
    for name in ("W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        view = getattr(grads, name)
        if view is not None:
            assert (view == 0).all(), name
    assert (grads.W_K != 0).any()


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_forward_gradient_read_through_the_W_O_view(kwargs):
    # Each head's contribution z_h W_O[h] is linear in W_O[h], so by Euler's identity
    # <dL/dW_O[h], W_O[h]> = <upstream, result[h]> for L = <upstream, output>: the
    # gradient read through the view must line up with the view head by head.
    layer = make_layer(kwargs)
    query, key, value = inputs(layer)
    result = layer(query, key, value, return_result=True)
    upstream = torch.randn(result.output.shape, dtype=torch.float64)
    (result.output * upstream).sum().backward()
    grad_W_O = _grads_as_layer(layer).W_O.detach()
    for h in range(layer.config.n_heads):
        torch.testing.assert_close(
            (grad_W_O[h] * layer.W_O[h].detach()).sum(),
            (result.result[:, h].detach() * upstream).sum(),
            atol=1e-10, rtol=0,
        )
