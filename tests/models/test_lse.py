"""Tapped heads' patterns from the fused kernel's log-sum-exp in real (tiny) models.

With a few heads tapped, headlab's attention function runs the fused CPU kernel that returns
each row's log-sum-exp beside z, and forms the tapped heads' patterns as ``exp(q kᵀ · scaling +
mask − lse)`` on the mask transformers built (padding, causal, sliding windows, grouped- and
multi-query heads). Per architecture they must equal the explicit softmax path (itself checked
against a float64 reference in test_architectures.py) on real queries and keys, in float64 to
1e-12; where the kernel does not serve (a gradient wanted, dropout) the explicit path runs.

Axis legend: patterns ``(batch, head, query_pos, key_pos)``; token masks ``(batch, pos)``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import headlab
from headlab.capture.taps import tapped
from headlab.models import headed, interface
from tests.support.tiny import ARCHITECTURES, batch, build, built

# Soft-capped logits take the explicit path for every head (the kernel cannot soft-cap).
LSE_ARCHITECTURES = [name for name in ARCHITECTURES if "logit soft-capping" not in ARCHITECTURES[name].features]


@pytest.fixture
def lse_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the tapped patterns formed from a log-sum-exp."""
    calls: list[int] = []
    original = interface.softmax_from_lse

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(interface, "softmax_from_lse", spy)
    return calls


def _patterns(model: Any, ids: torch.Tensor, mask: torch.Tensor | None, *,
              grad: bool = False) -> dict[int, torch.Tensor]:
    """The tapped patterns of heads (layer % 2, layer % 2 + 2) in every layer."""
    sites = headed(model).sites
    selection = {s.layer: [s.layer % 2, s.layer % 2 + 2] for s in sites}
    taken: dict[int, torch.Tensor] = {}
    with torch.set_grad_enabled(grad), tapped(sites, selection, ("pattern",),
                                              lambda layer, out: taken.__setitem__(layer, out.pattern)):
        model(input_ids=ids, attention_mask=mask)
    return taken


def _explicit(model: Any, ids: torch.Tensor, mask: torch.Tensor | None, monkeypatch: pytest.MonkeyPatch,
              **kwargs: Any) -> dict[int, torch.Tensor]:
    """The same patterns through the explicit softmax (the kernel made unavailable)."""
    with monkeypatch.context() as patch:
        patch.setattr(interface, "fused_attention_with_lse", lambda *a, **k: None)
        return _patterns(model, ids, mask, **kwargs)


def _assert_equal_on_real(got: dict[int, torch.Tensor], want: dict[int, torch.Tensor], mask: torch.Tensor | None,
                          tol: float) -> None:
    assert got.keys() == want.keys()
    for layer in got:
        g, w = got[layer], want[layer]
        assert g.shape == w.shape and g.dtype == w.dtype, layer
        real = torch.ones(g.shape[0], g.shape[-1], dtype=torch.bool) if mask is None else mask.bool()
        keys = real[:, None, :, None] & real[:, None, None, :]
        assert float((g.double() - w.double()).abs().masked_fill(~keys, 0).max()) <= tol, layer
        assert not g.masked_fill(~keys, 0).isnan().any(), layer


@pytest.mark.parametrize("padding", ["left", "right", "none"])
@pytest.mark.parametrize("name", LSE_ARCHITECTURES)
def test_tapped_patterns_from_the_log_sum_exp_equal_the_explicit_softmax(name, padding, lse_calls, monkeypatch):
    model = headlab.attach(built(name).double()).model
    ids, mask = batch(padding=padding)
    mask_arg = None if padding == "none" else mask  # no mask at all: the kernel's own causal flag
    got = _patterns(model, ids, mask_arg)
    assert len(lse_calls) == len(got), "the log-sum-exp path did not run in every layer"
    _assert_equal_on_real(got, _explicit(model, ids, mask_arg, monkeypatch), mask_arg, 1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("name", ["llama", "mistral", "bert", "gpt2"])
def test_lower_precision_tapped_patterns_track_the_explicit_softmax(name, dtype, tol, lse_calls, monkeypatch):
    model = headlab.attach(built(name).to(dtype)).model
    ids, mask = batch(padding="left" if ARCHITECTURES[name].causal else "right")
    got = _patterns(model, ids, mask)
    assert lse_calls
    _assert_equal_on_real(got, _explicit(model, ids, mask, monkeypatch), mask, tol)


def test_a_wanted_gradient_takes_the_explicit_path(lse_calls, monkeypatch):
    model = headlab.attach(built("llama").double()).model
    ids, mask = batch(padding="left")
    got = _patterns(model, ids, mask, grad=True)
    assert not lse_calls
    assert all(p.requires_grad for p in got.values())
    _assert_equal_on_real({k: p.detach() for k, p in got.items()}, _patterns(model, ids, mask), mask, 1e-12)


def test_dropout_in_training_takes_the_explicit_path(lse_calls):
    model = headlab.attach(build("bert", attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0).double())
    model = model.model.train()
    ids, mask = batch(padding="right")
    with torch.no_grad():
        got = _patterns(model, ids, mask)
    assert not lse_calls
    assert all(torch.isfinite(p).all() for p in got.values())
