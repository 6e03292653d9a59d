"""Vision transformers attach exactly: tiny random ViT, DeiT, DINOv2, CLIP's and SigLIP's vision towers, BEiT and Swin
(windowed attention), probed through pixels (``main_input_name == "pixel_values"``).

For each: with nothing asked the attached model's output equals the plain SDPA model's; ``output_attentions``
equals eager's; tapped patterns, z and results equal what the model computes (float64: eager's attentions, the
output projection's input and output); masking a head zeroes its z alone; pruning it equals masking it (Swin's
relative position bias table, a column per head, sliced with the kept heads), and a pruned model saves and loads
identical. Images as inputs, position labels and the commands: tests/models/test_images.py,
tests/cli/test_vision_cli.py; Swin's windows on the patch grid: tests/models/test_windows.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import headlab
from headlab import heads
from tests.support.families import FAMILIES
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

MODELS = ["vit", "deit", "dinov2", "clip_vision", "siglip_vision", "beit", "swin"]  # tests/support/families.py


def _build(name: str, implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return FAMILIES[name].build(implementation, dtype)


def _biased(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its relative position bias tables (zeros at init) seeded random, so that pruning a head's
    column of them is tested."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("relative_position_bias_table"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return model


def _pixels(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=dtype)


def _output(model: torch.nn.Module, pixels: torch.Tensor, **kwargs: Any) -> Any:
    with torch.no_grad():
        return model(pixel_values=pixels, **kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_attached_outputs_and_attentions_equal_transformers(name):
    pixels = _pixels()
    plain, eager = _build(name), _build(name, "eager")
    handle = headlab.attach(_build(name))
    assert [site.layer for site in handle.sites] == list(range(len(handle.sites))) and handle.tokenizer is None
    torch.testing.assert_close(_output(handle.model, pixels)[0], _output(plain, pixels)[0], rtol=1e-5, atol=1e-5)
    got, want = _output(handle.model, pixels, output_attentions=True), _output(eager, pixels, output_attentions=True)
    for ours, theirs in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_taps_equal_what_the_model_computes(name):
    """float64: z is the output projection's input, head by head, and the tapped pattern times the tapped v gives
    it; the results and the projection's bias sum to its output; the patterns are eager's attentions (to eager's
    own precision: it takes its softmax in float32)."""
    pixels = _pixels(torch.float64)
    want = _output(_build(name, "eager", torch.float64), pixels, output_attentions=True).attentions
    handle = headlab.attach(_build(name, dtype=torch.float64))
    cache = check_taps(handle, pixels)
    for site in handle.sites:
        torch.testing.assert_close(cache["pattern", site.layer], want[site.layer], rtol=0, atol=1e-7)


@pytest.mark.parametrize("name", MODELS)
def test_masking_zeroes_one_head_and_pruning_equals_masking(name):
    pixels = _pixels()
    handle = headlab.attach(_biased(_build(name)))
    before = headlab.run_with_cache(handle, pixels, take="z")["z", 0]
    heads.mask(handle, {0: [1]})
    masked_z = headlab.run_with_cache(handle, pixels, take="z")["z", 0]
    assert not masked_z[:, 1].any() and torch.equal(masked_z[:, [0, *range(2, before.shape[1])]],
                                                    before[:, [0, *range(2, before.shape[1])]])
    masked = _output(handle.model, pixels)[0]
    pruned = headlab.attach(_biased(_build(name)))
    heads.prune(pruned, {0: [1]})
    assert pruned.sites[0].n_heads == handle.sites[0].n_heads - 1
    torch.testing.assert_close(_output(pruned.model, pixels)[0], masked, rtol=1e-5, atol=1e-5)


def test_patch_and_circuit_name_a_missing_image_processor_in_one_line(tmp_path):
    """view, analyze, patch and circuit read images (tests/cli/test_vision_cli.py, test_image_pairs.py): here a
    checkpoint without its image processor, which each names in one line."""
    from typer.testing import CliRunner

    from headlab.cli import app

    _build("vit").save_pretrained(tmp_path / "vit")
    for command in (["patch", "--clean", "a b", "--corrupt", "a c"], ["circuit", "--clean", "a b", "--corrupt", "a c"]):
        result = CliRunner().invoke(app, [command[0], str(tmp_path / "vit"), *command[1:]])
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and "has no preprocessor_config.json" in said, result.output
        assert len(result.output.strip().splitlines()) <= 3 and "Traceback" not in result.output


@pytest.mark.parametrize("name", ["vit", "dinov2", "swin"])
def test_a_pruned_and_masked_model_saves_and_loads_identical(name, tmp_path):
    handle = headlab.attach(_biased(_build(name)))
    before = [site.n_heads for site in handle.sites]
    heads.prune(handle, {1: [2]})
    heads.mask(handle, {0: [0]})
    path = heads.save(handle, tmp_path / name)
    loaded = headlab.load(path)
    assert [site.n_heads for site in loaded.sites] == [before[0], before[1] - 1]
    assert torch.equal(_output(loaded.model, _pixels())[0], _output(handle.model, _pixels())[0])
