"""headlab patch and headlab circuit on an image model: --clean and --corrupt are image files, compared by the
similarity of the output to the clean image's; what does not fit is one line, exit 2, before any forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.vision import save_vision, write_images


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    root = tmp_path_factory.mktemp("vit")
    return str(save_vision(root / "vit")), [str(p) for p in write_images(root / "images", 2)]


def test_patch_reads_two_images_and_its_numbers_are_the_librarys(vit, tmp_path):
    import headlab
    from headlab.analysis.patching import activation_patching, text_metric

    checkpoint, (clean, corrupt) = vit
    ran = CliRunner().invoke(app, ["patch", checkpoint, "--clean", clean, "--corrupt", corrupt, "--method", "exact",
                                   "--out", str(tmp_path / "p"), "--json"])
    assert ran.exit_code == 0, ran.output
    document = json.loads(ran.stdout)
    loaded = headlab.load(checkpoint)
    metric, _ = text_metric(loaded, clean)
    want = activation_patching(loaded, clean, corrupt, metric)
    rows = document["results"][0]["heads"]["rows"]
    assert [(r["layer"], r["head"]) for r in rows] == list(want.table.heads)
    np.testing.assert_allclose([r["effect"] for r in rows], want.table["effect"], rtol=1e-5, atol=1e-7)
    assert document["results"][0]["clean_metric"] == pytest.approx(1.0)
    assert document["metric"] == "cosine similarity of the mean-pooled output to the clean image's"


def test_circuit_reads_two_images(vit, tmp_path):
    checkpoint, (clean, corrupt) = vit
    ran = CliRunner().invoke(app, ["circuit", checkpoint, "--clean", clean, "--corrupt", corrupt, "--method", "eap",
                                   "--top", "5", "--out", str(tmp_path / "c"), "--json"])
    assert ran.exit_code == 0, ran.output
    found = json.loads(ran.stdout)
    assert len(found["edges"]) == 5 and found["details"]["clean_metric"] == pytest.approx(1.0)


@pytest.mark.parametrize("args, said", [
    (["--corrupt", "a dog"], "--corrupt 'a dog': ViTModel takes images; expected an image file"),
    (["--corrupt", "{corrupt}", "--metric", "logit-diff", "--answer", "a", "--wrong", "b"],
     "--metric logit-diff: an image model is compared by the similarity"),
])
def test_what_an_image_model_cannot_take_is_one_line(vit, tmp_path, args, said):
    checkpoint, (clean, corrupt) = vit
    for command in ("patch", "circuit"):
        given = [a.format(corrupt=corrupt) for a in args]
        ran = CliRunner().invoke(app, [command, checkpoint, "--clean", clean, *given, "--out", str(tmp_path / command)])
        assert ran.exit_code == 2 and said in " ".join(ran.output.split()), ran.output
        assert len(ran.output.strip().splitlines()) <= 2  # one line, wrapped at most once by the terminal width


def test_patching_each_position_labels_an_images_positions_as_patches(vit, tmp_path):
    checkpoint, (clean, corrupt) = vit
    ran = CliRunner().invoke(app, ["patch", checkpoint, "--clean", clean, "--corrupt", corrupt, "--method", "exact",
                                   "--positions", "each", "--top", "40", "--out", str(tmp_path / "p")])
    assert ran.exit_code == 0, ran.output
    said = " ".join(ran.output.split())
    assert "0 [CLS]" in said and "16 patch r3c3" in said  # a 4 × 4 grid behind [CLS]
