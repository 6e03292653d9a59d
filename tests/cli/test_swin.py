"""`headlab analyze --images` and `headlab view MODEL IMAGE...` on a tiny random Swin (windowed attention, a grid per
stage) saved beside a tiny image processor resizing to 20 × 20 pixels (grids of 5 × 5 then 3 × 3 patches, both padded
to whole windows); what cannot be read is refused in one line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.vision import save_vision, write_images

runner = CliRunner()
pytest.importorskip("transformers")
GRIDS = [5, 5, 3, 3]  # each layer's grid side: two blocks per stage


@pytest.fixture(scope="module")
def swin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vision(tmp_path_factory.mktemp("swin"), "swin", size=20)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    write_images(folder)
    return folder


def test_analyze_quick_measures_each_layer_on_its_own_grid(swin, pictures, tmp_path):
    result = runner.invoke(app, ["analyze", str(swin), "--quick", "--images", str(pictures), "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    summary, rows = document["summary"], document["heads"]
    assert summary["items"] == 3 and summary["tokens"] == 3 * 25 and len(rows) == 2 + 2 + 4 + 4
    grid = summary["grid"]
    assert (grid["rows"], grid["columns"], grid["special"]) == (5, 5, [])
    assert [(g["rows"], g["window"]["side"], g.get("stride", [1, 1])) for g in grid["layers"]] == [
        (5, 2, [1, 1]), (5, 2, [1, 1]), (3, 2, [2, 2]), (3, 2, [2, 2])]
    assert [g["window"]["shift"] for g in grid["layers"]] == [0, 1, 0, 1]
    assert "first-stage patches" in grid["distance_unit"]
    for row in rows:
        side = GRIDS[row["layer"]]
        assert row["n_queries"] == 3 * side * side
        assert row["uniform_entropy"] == pytest.approx(math.log(side * side))
        assert 0 < row["entropy"] <= math.log(4) + 1e-6  # within a 2 × 2 window
        assert 0 < row["patch_distance"] < 2 * math.sqrt(2) + 1e-6  # within a window, in first-stage patches
        assert "to_cls" not in row and "to_special" not in row and row["importance_gradient"] is not None
    assert "no [CLS]" in summary["skipped"]["to_cls, to_special and the sink role"]
    assert any("distances in first-stage patches" in sentence for sentence in document["sentences"])
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"heads.json", "heads.csv", "heatmaps.png", "mds.png",
                                                               "pruning.png"}


def test_view_carries_the_first_grid_and_every_layers_own(swin, pictures, tmp_path):
    out = tmp_path / "x.html"
    result = runner.invoke(app, ["view", str(swin), str(pictures / "image0.png"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(re.search(r'id="viewer-data">(.*?)</script>', out.read_text()).group(1))
    item = payload["items"][0]
    image = item["image"]
    assert (image["rows"], image["columns"], image["first"]) == (5, 5, 0)
    assert [(g["rows"], g["strideY"]) for g in image["layers"]] == [(5, 1), (5, 1), (3, 2), (3, 2)]
    assert item["pieces"]["labels"] == [f"patch r{r}c{c}" for r in range(5) for c in range(5)]
    assert all(p["n"] == 25 for p in item["pieces"]["patterns"]) and len(payload["heads"]) == 12


def test_what_cannot_be_read_is_refused_in_one_line(swin, pictures, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    bare = save_vision(tmp_path / "bare", "swin", processor=False)
    for args, said in ((["view", str(swin), str(broken)], "not an image Pillow can read"),
                       (["analyze", str(bare), "--quick", "--images", str(pictures)],
                        "has no preprocessor_config.json")):
        result = runner.invoke(app, args)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert said in lines[0], result.output
