"""Row-relative byte patterns, thumbnails, and JSON that cannot end its <script> element."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest
import torch

from headlab.capture.words import pattern_to_words
from headlab.report.viewer.encoding import QuantizedPattern, quantize, script_json, thumbnails


def _softmax_pattern(n: int, *, sharpness: float, causal: bool = False, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, n, generator=g) * sharpness
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return logits.softmax(-1)


@pytest.mark.parametrize("sharpness", [0.1, 1.0, 8.0])
@pytest.mark.parametrize("causal", [False, True])
def test_values_are_within_half_a_step_of_each_rows_largest_weight(sharpness: float, causal: bool) -> None:
    p = _softmax_pattern(37, sharpness=sharpness, causal=causal)
    q = quantize(p)
    values = q.values()
    assert values.shape == (37, 37) and values.dtype == np.float32
    scale = p.amax(1).numpy()
    np.testing.assert_allclose(q.scale, scale, rtol=1e-6)
    error = np.abs(values - p.numpy())
    assert (error <= scale[:, None] / 510 + 1e-7).all()
    assert (q.codes().max(axis=1) == 255).all()  # each row's largest weight is exact
    if causal:
        assert (np.triu(values, 1) == 0).all()


def test_a_row_of_zeros_stays_zero_and_bad_patterns_are_refused() -> None:
    p = torch.zeros(3, 3)
    p[1] = torch.tensor([0.25, 0.5, 0.25])
    values = quantize(p).values()
    assert (values[0] == 0).all() and (values[2] == 0).all()
    np.testing.assert_allclose(values[1], [0.25, 0.5, 0.25], atol=0.5 / 510)
    with pytest.raises(ValueError, match="expected \\(n, m\\)"):
        quantize(torch.ones(3))
    with pytest.raises(ValueError, match="finite and ≥ 0"):
        quantize(torch.tensor([[1.0, -0.1], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="finite and ≥ 0"):
        quantize(torch.tensor([[float("nan"), 0.0], [0.5, 0.5]]))


def test_to_dict_is_what_the_browser_decodes() -> None:
    q = quantize(_softmax_pattern(9, sharpness=2.0))
    d = q.to_dict()
    scale = np.frombuffer(base64.b64decode(d["scale"]), dtype="<f4")
    codes = np.frombuffer(zlib.decompress(base64.b64decode(d["codes"])), dtype=np.uint8).reshape(9, 9)
    np.testing.assert_array_equal(codes.astype(np.float32) * (scale[:, None] / np.float32(255)), q.values())
    assert d["n"] == 9 and q.nbytes == len(q.deflated) + 9 * 4


def test_a_rectangle_encodes_its_rows_over_its_own_keys() -> None:
    """Cross-attention's target × source pattern: n rows of m keys, each within half a step of its largest."""
    g = torch.Generator().manual_seed(3)
    p = (torch.randn(2, 7, generator=g) * 3).softmax(-1)
    q = quantize(p)
    assert (q.n, q.m, q.to_dict()["m"]) == (2, 7, 7) and q.values().shape == (2, 7)
    assert (np.abs(q.values() - p.numpy()) <= p.amax(1, keepdim=True).numpy() / 510 + 1e-7).all()


def test_thumbnails_of_heads_of_several_shapes_share_one_grid() -> None:
    """An encoder-decoder's heads (5 × 5, 1 × 5, 1 × 1) each become t × t, t their longest side; a 1-row pattern is
    stretched over every row."""
    row = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]])
    size, deflated = thumbnails([_softmax_pattern(5, sharpness=2.0), row, torch.ones(1, 1)], size=10)
    codes = np.frombuffer(zlib.decompress(deflated), dtype=np.uint8).reshape(3, 5, 5)
    assert size == 5 and (codes[1] == np.round(row.numpy() / 0.4 * 255)).all() and (codes[2] == 255).all()


def test_a_sharp_causal_pattern_deflates_far_below_one_byte_per_entry() -> None:
    q = quantize(_softmax_pattern(400, sharpness=12.0, causal=True))
    assert q.nbytes < 0.25 * 400 * 400


def test_thumbnails_pool_like_words_and_scale_each_head_to_its_peak() -> None:
    p = torch.stack([_softmax_pattern(100, sharpness=s, seed=i) for i, s in enumerate((0.5, 4.0))])
    size, deflated = thumbnails(p, size=10)
    codes = np.frombuffer(zlib.decompress(deflated), dtype=np.uint8).reshape(2, 10, 10)
    pooled = pattern_to_words(p.double(), torch.arange(100) // 10, n_units=10).numpy()
    expected = np.round(pooled * 255 / pooled.reshape(2, -1).max(1)[:, None, None])
    assert size == 10 and np.abs(codes.astype(int) - expected).max() <= 1
    assert (codes.reshape(2, -1).max(1) == 255).all()
    small, _ = thumbnails(p[:, :7, :7], size=10)
    assert small == 7  # never more cells than positions


def test_script_json_cannot_close_its_script_element_and_parses_back() -> None:
    value = {"text": "</script><script>alert(1)</script><!-- & \u2028\u2029 <img src=x onerror=alert(2)>",
             "<key>": ["</SCRIPT>", "ok"]}
    text = script_json(value)
    for forbidden in ("<", ">", "&", "\u2028", "\u2029"):
        assert forbidden not in text
    assert json.loads(text) == value


def test_script_json_refuses_nan() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        script_json({"x": float("nan")})


def test_quantized_pattern_is_a_value() -> None:
    q = quantize(torch.eye(3))
    assert isinstance(q, QuantizedPattern) and q.n == 3
    np.testing.assert_array_equal(q.values(), np.eye(3, dtype=np.float32))
