"""A few heads' patterns from the fused kernel's log-sum-exp, against the explicit softmax.

``attend`` with ``pattern_heads`` a strict subset of the heads runs the fused CPU kernel that
also returns each row's log-sum-exp, and forms the asked heads' patterns as
``exp(q kᵀ · scale + bias − lse)``. Each case builds its masks with ``build_mask`` (as the layer
does) and compares with a float64 softmax written here from the raw masks; rows that see no key
must be zero. The fallbacks (no such kernel: dropout, a gradient wanted, another device, value
heads of another size) must give the same patterns through the explicit softmax.

Axis legend: q ``(batch, head, query_pos, d_head)``; k, v ``(batch, kv_head, key_pos, d_head)``;
patterns ``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headlab.layer import functional
from headlab.layer.functional import attend, fused_attention_with_lse
from headlab.layer.masks import build_mask

B, H, L, D = 3, 4, 7, 8
HEADS = [1, 3]
SCALE = D ** -0.5


def _qkv(*, n_kv: int = H, k_len: int = L, dtype: torch.dtype = torch.float64, d_v: int = D,
         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, n_kv, k_len, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, n_kv, k_len, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _reference(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 softmax(q kᵀ · scale + bias) of every head, consecutive query heads sharing a key head; dead rows 0."""
    q, k = q.double(), k.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-1, -2) * SCALE
    if bias is not None:
        scores = scores + bias
    dead = torch.isneginf(scores).all(-1, keepdim=True)
    return scores.masked_fill(dead, 0.0).softmax(-1).masked_fill(dead, 0.0)


def _blocked(mask: torch.Tensor) -> torch.Tensor:
    """bool True = not allowed → additive 0 / -inf in float64."""
    return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask, float("-inf"))


def _case(name: str) -> dict[str, Any]:
    """The masks of one case: ``build_mask`` arguments, the additive float64 bias they mean, the key length."""
    g = torch.Generator().manual_seed(1)
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[1, -2:] = True
    padding[2, :3] = True
    causal_square = torch.ones(L, L, dtype=torch.bool).triu(1)
    if name == "none":
        return dict(args={}, bias=None)
    if name == "causal":
        return dict(args=dict(causal=True), bias=_blocked(causal_square))
    if name == "causal, fewer queries than keys":  # end-aligned: query i sees keys ≤ i + 3
        return dict(args=dict(causal=True), bias=_blocked(torch.ones(L, L + 3, dtype=torch.bool).triu(4)), k_len=L + 3)
    if name == "key padding (bool)":
        return dict(args=dict(key_padding_mask=padding), bias=_blocked(padding[:, None, None, :]))
    if name == "key padding (float)":
        additive = torch.randn(B, L, generator=g, dtype=torch.float64)
        return dict(args=dict(key_padding_mask=additive), bias=additive[:, None, None, :])
    if name == "additive float bias":
        additive = torch.randn(L, L, generator=g, dtype=torch.float64)
        return dict(args=dict(attn_mask=additive), bias=additive)
    if name == "bool mask":
        blocked = torch.rand(L, L, generator=g) < 0.3
        blocked[:, 0] = False
        return dict(args=dict(attn_mask=blocked), bias=_blocked(blocked))
    if name == "per-head mask":
        additive = torch.randn(B * H, L, L, generator=g, dtype=torch.float64)
        return dict(args=dict(attn_mask=additive), bias=additive.view(B, H, L, L))
    if name == "causal and key padding":
        return dict(args=dict(causal=True, key_padding_mask=padding),
                    bias=_blocked(causal_square | padding[:, None, None, :]))
    if name == "dead rows":  # item 2's first three queries see only padding keys; item 0 is all padding
        dead = padding.clone()
        dead[0] = True
        return dict(args=dict(causal=True, key_padding_mask=dead),
                    bias=_blocked(causal_square | dead[:, None, None, :]))
    raise AssertionError(name)


CASES = ["none", "causal", "causal, fewer queries than keys", "key padding (bool)", "key padding (float)",
         "additive float bias", "bool mask", "per-head mask", "causal and key padding", "dead rows"]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: dict[str, Any], *,
            dropout_p: float = 0.0, heads: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    mask = build_mask(key_padding_mask=args.get("key_padding_mask"), attn_mask=args.get("attn_mask"),
                      causal=args.get("causal", False), batch=B, n_heads=H, q_len=q.shape[2], k_len=k.shape[2],
                      dtype=q.dtype, device=q.device)
    z, patterns = attend(q, k, v, mask, scale=SCALE, dropout_p=dropout_p,
                         pattern_heads=HEADS if heads is None else heads)
    assert patterns is not None
    return z, patterns


@pytest.fixture
def lse_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the patterns formed from a log-sum-exp (so a test knows which path ran)."""
    calls: list[int] = []
    original = functional.softmax_from_lse

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(functional, "softmax_from_lse", spy)
    return calls


@pytest.mark.parametrize("n_kv", [H, 2, 1], ids=["heads", "grouped-query", "multi-query"])
@pytest.mark.parametrize("name", CASES)
def test_patterns_from_the_log_sum_exp_equal_the_float64_softmax(name, n_kv, lse_calls):
    case = _case(name)
    q, k, v = _qkv(n_kv=n_kv, k_len=case.get("k_len", L))
    z, patterns = _attend(q, k, v, case["args"])
    assert lse_calls, "the log-sum-exp path did not run"
    expected = _reference(q, k, case["bias"])
    torch.testing.assert_close(patterns, expected[:, HEADS], atol=1e-12, rtol=0)
    torch.testing.assert_close(z, expected @ v.repeat_interleave(H // n_kv, dim=1), atol=1e-12, rtol=0)
    assert not patterns.isnan().any()


def test_dead_rows_are_zero_patterns_and_zero_z(lse_calls):
    case = _case("dead rows")
    q, k, v = _qkv()
    z, patterns = _attend(q, k, v, case["args"])
    assert lse_calls
    assert (patterns[0] == 0).all() and (z[0] == 0).all()
    assert (patterns[2, :, :3] == 0).all() and (z[2, :, :3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["causal and key padding", "additive float bias", "per-head mask"])
def test_lower_precision_patterns_track_the_float64_softmax(name, dtype, lse_calls):
    case = _case(name)
    q, k, v = _qkv(n_kv=2, dtype=dtype)
    args = {key: value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            for key, value in case["args"].items()}
    _, patterns = _attend(q, k, v, args)
    assert lse_calls and patterns.dtype == dtype
    bias = case["bias"] if case["bias"] is None else case["bias"].to(dtype).double()
    tol = 1e-6 if dtype == torch.float32 else 2e-2  # half precision: its scores' rounding, normalised in float32
    torch.testing.assert_close(patterns.double(), _reference(q, k, bias)[:, HEADS], atol=tol, rtol=0)


def test_half_precision_rows_are_normalised_in_float32():
    # Long rows: a half-precision normaliser would lose mass; exp(scores − lse) in float32 keeps the sum at 1.
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, 1024, D, generator=g).bfloat16() for _ in range(3))
    _, patterns = _attend(q, k, v, {"causal": True})
    sums = patterns.float().sum(-1)
    assert float((sums - 1).abs().max()) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k_len", [128, 4096], ids=["one-warp kernel", "block kernel"])
def test_half_precision_patterns_on_cuda_are_the_float32_softmax_to_the_bit(dtype, k_len):
    # On CUDA the explicit path skips the float32 copy: torch's kernel accumulates in float32 itself.
    g = torch.Generator().manual_seed(3)
    scores = (4 * torch.randn(2, H, 64, k_len, generator=g)).to("cuda", dtype)
    blocked = torch.ones(64, k_len, dtype=torch.bool, device="cuda").triu(k_len - 64 + 1)[None, None]
    want = scores.float().masked_fill(blocked, float("-inf")).softmax(-1).to(dtype)
    assert torch.equal(functional.masked_softmax(scores.clone(), blocked, None), want)
    assert torch.equal(functional.key_softmax(scores.masked_fill(blocked, float("-inf"))), want)


@pytest.mark.parametrize("heads", [[0], [2, 0], [3, 1, 2]])
def test_subsets_in_any_order_equal_the_explicit_path(heads, lse_calls):
    q, k, v = _qkv(n_kv=2)
    args = _case("causal and key padding")["args"]
    _, every = _attend(q, k, v, args, heads=list(range(H)))  # every head: the explicit path
    assert not lse_calls
    _, some = _attend(q, k, v, args, heads=heads)
    assert lse_calls
    torch.testing.assert_close(some, every[:, heads], atol=1e-12, rtol=0)


# --- where the kernel is not available ----------------------------------------------------------------------------

def test_dropout_falls_back_and_patterns_are_before_dropout(lse_calls):
    case = _case("key padding (bool)")
    q, k, v = _qkv()
    torch.manual_seed(0)
    _, patterns = _attend(q, k, v, case["args"], dropout_p=0.5)
    assert not lse_calls
    torch.testing.assert_close(patterns, _reference(q, k, case["bias"])[:, HEADS], atol=1e-12, rtol=0)


def test_a_wanted_gradient_falls_back_and_flows(lse_calls):
    case = _case("causal and key padding")
    q, k, v = _qkv()
    q.requires_grad_(True)
    _, patterns = _attend(q, k, v, case["args"])
    assert not lse_calls
    torch.testing.assert_close(patterns.detach(), _reference(q.detach(), k, case["bias"])[:, HEADS], atol=1e-12,
                               rtol=0)
    patterns.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_inference_with_grad_enabled_but_no_grad_wanted_uses_the_kernel(lse_calls):
    q, k, v = _qkv()
    with torch.enable_grad():
        _attend(q, k, v, {})
    assert lse_calls


def test_value_heads_of_another_size_fall_back(lse_calls):
    case = _case("key padding (bool)")
    q, k, v = _qkv(d_v=5)
    z, patterns = _attend(q, k, v, case["args"])
    assert not lse_calls
    expected = _reference(q, k, case["bias"])
    torch.testing.assert_close(patterns, expected[:, HEADS], atol=1e-12, rtol=0)
    torch.testing.assert_close(z, expected @ v, atol=1e-12, rtol=0)


def test_a_torch_without_the_kernel_falls_back(lse_calls, monkeypatch):
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    case = _case("causal and key padding")
    q, k, v = _qkv(n_kv=2)
    _, patterns = _attend(q, k, v, case["args"])
    assert not lse_calls
    torch.testing.assert_close(patterns, _reference(q, k, case["bias"])[:, HEADS], atol=1e-12, rtol=0)


@pytest.mark.parametrize("why", ["another device", "dropout", "gradient", "value size", "integer dtype", "no keys",
                                 "no kernel", "grouped heads before torch 2.5"])
def test_no_kernel_is_none(why, monkeypatch):
    q, k, v = _qkv(dtype=torch.float32)
    if why == "grouped heads before torch 2.5":
        monkeypatch.setattr(functional, "_SDPA_HAS_GQA", False)
        k, v = k[:, :2], v[:, :2]
    elif why == "no kernel":
        monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    elif why == "another device":
        q, k, v = (x.to("meta") for x in (q, k, v))
    elif why == "gradient":
        q.requires_grad_(True)
    elif why == "value size":
        v = v[..., :5]
    elif why == "integer dtype":
        q, k, v = (x.long() for x in (q, k, v))
    elif why == "no keys":
        k, v = k[:, :, :0], v[:, :, :0]
    kwargs = dict(bias=None, is_causal=False, scale=SCALE, dropout_p=0.1 if why == "dropout" else 0.0)
    assert fused_attention_with_lse(q, k, v, **kwargs) is None
