"""`headlab analyze --images` and `headlab view MODEL IMAGE...` on tiny random vision transformers saved beside a tiny
image processor (no download); the other commands refuse an image model in one line, and so does a checkpoint
without its image processor, a text model given images, an image model given text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.vision import SPECIAL, save_vision, write_images

runner = CliRunner()
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vision(tmp_path_factory.mktemp("vit"), "vit")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    write_images(folder)
    return folder


def _one_line(result, *said: str) -> None:
    """Exit 2 with one ``error:`` line holding every part of ``said``."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in said:
        assert part in lines[0], result.output


def test_analyze_quick_on_images_measures_distance_sinks_and_entropy(vit, pictures, tmp_path):
    result = runner.invoke(app, ["analyze", str(vit), "--quick", "--images", str(pictures), "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    summary, rows = document["summary"], document["heads"]
    assert summary["items"] == 3 and summary["tokens"] == 3 * 17 and len(rows) == 2 * 4
    assert summary["grid"] == {"rows": 4, "columns": 4, "special": ["[CLS]"], "patch_size": [4, 4]}
    for row in rows:
        assert row["n_queries"] == 3 * 16 and 0 < row["patch_distance"] < 4.3  # within the 4 × 4 grid's diagonal
        assert 0 < row["to_cls"] == row["to_special"] < 1 and 0 < row["entropy"] <= row["uniform_entropy"] + 1e-9
        assert row["importance_gradient"] is not None and "to_prev" not in row and row["pattern_class"] == ""
    skipped = summary["skipped"]
    for part in ("text statistics and roles", "pattern classes", "syntax", "causal probes",
                 "retrieval and streaming heads", "ablation importance"):
        assert skipped[part], part
    assert "patch_distance" in skipped["text statistics and roles"]
    assert list(document["pruning"]) == ["embedding cosine to the unpruned model"]
    assert any("patch grid" in sentence for sentence in document["sentences"])
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"heads.json", "heads.csv", "heatmaps.png", "mds.png",
                                                               "pruning.png"}


def test_analyze_prints_the_heads_on_images_and_what_it_skipped(vit, pictures, tmp_path):
    result = runner.invoke(app, ["analyze", str(vit), "--quick", "--no-importance", "--images", str(pictures),
                                 "--out", str(tmp_path / "out")], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "3 images, 51 positions, 8 heads" in said and "Heads on images, the 8 of 8 that look nearest" in said
    assert "skipped pattern classes: Kovaleva" in said and "skipped importance: not asked for" in said


@pytest.mark.parametrize("kind", ["vit", "deit", "dinov2"])
def test_view_writes_the_picture_and_every_position(kind, pictures, tmp_path):
    folder = save_vision(tmp_path / kind, kind)
    out = tmp_path / "x.html"
    result = runner.invoke(app, ["view", str(folder), str(pictures / "image0.png"), str(pictures), "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(re.search(r'id="viewer-data">(.*?)</script>', out.read_text()).group(1))
    assert [item["text"] for item in payload["items"]] == ["image0.png", "image0.png", "image1.png", "image2.png"]
    item = payload["items"][0]
    assert item["image"]["src"].startswith("data:image/png;base64,") and item["words"] is None
    assert item["image"]["rows"] == item["image"]["columns"] == 4 and item["image"]["first"] == len(SPECIAL[kind])
    assert item["pieces"]["labels"][:len(SPECIAL[kind]) + 1] == [*SPECIAL[kind], "patch r0c0"]
    assert "patch_distance" in payload["info"][0]["stats"]
    assert f"on {len(SPECIAL[kind]) + 16} positions" in " ".join(result.output.split())


def test_an_image_model_given_text_and_a_text_model_given_images_are_refused(vit, pictures, tmp_path):
    out = ["--out", str(tmp_path / "x.html")]
    _one_line(runner.invoke(app, ["view", str(vit), "a cat on a mat", *out]), "ViTModel takes images, not text")
    _one_line(runner.invoke(app, ["view", str(pictures / "image0.png"), *out]),
              "'" + str(pictures / "image0.png") + "' is an image", "(BertModel) reads text")
    _one_line(runner.invoke(app, ["analyze", str(vit), "--quick", "--out", str(tmp_path / "a")]),
              "ViTModel takes images, and headlab bundles none: give a folder of images with --images FOLDER")
    _one_line(runner.invoke(app, ["analyze", "--quick", "--images", str(pictures), "--out", str(tmp_path / "b")]),
              "--images is for an image model", "(BertModel) reads text")
    _one_line(runner.invoke(app, ["analyze", str(vit), "--images", str(tmp_path / "none"), "--out",
                                  str(tmp_path / "c")]), "no such file or folder")


def test_a_checkpoint_without_its_image_processor_names_the_file(pictures, tmp_path):
    bare = save_vision(tmp_path / "bare", "vit", processor=False)
    for command in (["view", str(bare), str(pictures), "--out", str(tmp_path / "x.html")],
                    ["analyze", str(bare), "--images", str(pictures), "--out", str(tmp_path / "out")]):
        _one_line(runner.invoke(app, command), "has no preprocessor_config.json (the checkpoint's image processor): "
                                               "add it")


def test_report_refuses_an_image_model_and_patch_a_text_for_it_in_one_line(vit, tmp_path):
    _one_line(runner.invoke(app, ["report", str(vit), "--quick", "--out", str(tmp_path / "report")]),
              "ViTModel takes pixel_values, not text")
    for command in ("patch", "circuit"):  # they read image files (tests/cli/test_image_pairs.py), not texts
        _one_line(runner.invoke(app, [command, str(vit), "--clean", "a b", "--corrupt", "a c"]),
                  "--clean 'a b': ViTModel takes images; expected an image file")
