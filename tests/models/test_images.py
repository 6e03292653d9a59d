"""Images into a vision transformer (``headlab.models.images``): a path, a folder, PIL images and pixel tensors go
through the checkpoint's own image processor (``headlab.load`` keeps it), a checkpoint without one is refused in one
line naming the file, and every position gets the label a person reads ([CLS], [DIST], reg 0, patch r0c0 …),
derived from the config and the number of positions the model runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import headlab
from headlab.capture import run_with_cache
from headlab.models import images
from tests.support.vision import SIZE, SPECIAL, save_vision, write_images

transformers = pytest.importorskip("transformers")
PATCHES = [f"patch r{r}c{c}" for r in range(4) for c in range(4)]  # the 4 × 4 grid of every tiny model


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> headlab.HeadedModel:
    return headlab.load(save_vision(tmp_path_factory.mktemp("vit"), "vit"))


def test_load_keeps_the_image_processor_and_every_input_form_gives_its_pixels(vit, tmp_path):
    paths = write_images(tmp_path / "images")
    assert type(vit.tokenizer).__name__.startswith("ViTImageProcessor")
    folder = vit.inputs(tmp_path / "images")["pixel_values"]
    assert folder.shape == (3, 3, SIZE, SIZE) and folder.dtype == torch.float32
    from PIL import Image

    with Image.open(paths[1]) as picture:
        pil = vit.inputs(picture.copy())["pixel_values"]
    torch.testing.assert_close(pil[0], folder[1])  # a PIL image as its file gives it
    torch.testing.assert_close(vit.inputs(str(paths[2]))["pixel_values"][0], folder[2])
    torch.testing.assert_close(vit.inputs([paths[0], paths[2]])["pixel_values"], folder[[0, 2]])
    assert torch.equal(vit.inputs(folder)["pixel_values"], folder)  # pixel values as they are


def test_what_cannot_be_read_is_refused_in_one_line(vit, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.png").write_bytes(b"not a png")
    for given, error, said in ((tmp_path / "missing.png", FileNotFoundError, "no such file or folder"),
                               (tmp_path / "empty", ValueError, "holds no image file"),
                               (tmp_path / "broken.png", ValueError, "not an image Pillow can read")):
        with pytest.raises(error, match=said) as caught:
            vit.inputs(given)
        assert "\n" not in str(caught.value)


def test_a_checkpoint_without_its_image_processor_names_the_file_to_add(tmp_path):
    handle = headlab.load(save_vision(tmp_path / "bare", "vit", processor=False))
    paths = write_images(tmp_path / "images", n=1)
    with pytest.raises(TypeError, match=r"bare has no preprocessor_config\.json .*: add it") as caught:
        handle.inputs(paths[0])
    assert handle.tokenizer is None and "\n" not in str(caught.value)


@pytest.mark.parametrize("kind", ["vit", "deit", "dinov2"])
def test_labels_name_the_special_tokens_then_the_patches_row_by_row(kind, tmp_path):
    handle = headlab.load(save_vision(tmp_path / kind, kind))
    inputs = handle.inputs(write_images(tmp_path / "images", n=2))
    labels = handle.labels(inputs)
    assert labels == [SPECIAL[kind] + PATCHES] * 2
    pattern = run_with_cache(handle, inputs, take="pattern")["pattern", 0]
    assert pattern.shape[-1] == len(labels[0])  # one label per position the attention runs over


def test_text_models_label_their_tokens(tmp_path):
    from tests.support.tiny import tiny

    model = tiny("bert")
    inputs = model.inputs("the cat sat")
    assert model.labels(inputs) == model.tokens(inputs)


def test_the_whole_image_grid_refuses_windows_and_a_config_without_patch_size():
    """``patch_grid`` reads whole-image attention; a windowed model's grids come from ``grid_of``
    (tests/models/test_windows.py)."""
    config = transformers.SwinConfig(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2, image_size=16,
                                     patch_size=4)
    swin = transformers.SwinModel(config).eval()
    pixels = torch.randn(1, 3, 16, 16)
    with pytest.raises(ValueError, match=r"not over the whole image \(a windowed model's grids: grid_of\)"):
        images.patch_grid(swin, height=16, width=16, positions=images.positions_of(swin, pixels))
    handle = headlab.attach(swin)
    grid = images.grid_of(swin, handle.sites, pixels)
    assert [(g.rows, g.columns) for g in grid.layers] == [(4, 4), (2, 2)] and grid.labels()[-1] == "patch r3c3"
    bare = torch.nn.Module()
    bare.config = SimpleNamespace(patch_size=None)
    with pytest.raises(ValueError, match="has no patch_size"):
        images.patch_grid(bare, height=16, width=16, positions=17)


def test_the_grid_measures_distances_in_patches(vit):
    grid = images.PatchGrid(rows=2, columns=3, special=("[CLS]",), patch_size=(4, 4))
    assert grid.position(1, 2) == 6 and grid.labels()[6] == "patch r1c2" and grid.of(1) is grid
    assert grid.distances()[0, 5].item() == pytest.approx(np.hypot(1, 2))  # r0c0 to r1c2
    pixels = torch.zeros(1, 3, SIZE, SIZE)
    assert images.grid_of(vit.model, vit.sites, pixels) == images.PatchGrid(rows=4, columns=4, special=("[CLS]",),
                                                                           patch_size=(4, 4))


def test_the_picture_is_what_the_model_sees(vit, tmp_path):
    from PIL import Image

    path = tmp_path / "flat.png"
    Image.new("RGB", (24, 20), (200, 40, 90)).save(path)
    pixels = vit.inputs(path)["pixel_values"][0]
    shown = np.asarray(images.picture(pixels, vit.tokenizer))
    assert shown.shape == (SIZE, SIZE, 3) and (np.abs(shown.astype(int) - [200, 40, 90]) <= 1).all()


def test_analyze_of_an_image_model_needs_its_images_and_runs_in_this_process(vit):
    from headlab.analysis.analyze import analyze

    with pytest.raises(ValueError, match=r"ViTModel takes images and headlab bundles none: give a folder of images"):
        analyze(vit)
    with pytest.raises(ValueError, match=r"engine='ray': the Ray engine shards text corpora; an image model runs with "
                                         r"engine='local'"):
        analyze(vit, torch.zeros(1, 3, SIZE, SIZE), engine="ray")


def test_the_viewer_of_a_cache_refuses_an_image_models_forward_in_one_line(vit):
    from headlab.report.viewer import cache_view_data

    cache = run_with_cache(vit, torch.zeros(1, 3, SIZE, SIZE), take="pattern")
    with pytest.raises(ValueError, match=r"this cache's forward had no token ids, and the viewer of a cache shows one "
                                         r"token sequence per item: view images, audio and source/target pairs with "
                                         r"view_data\(model, inputs\)"):
        cache_view_data(cache)
