"""`headlab analyze --audio` and `headlab view MODEL WAV...` on a tiny random Whisper saved beside a tiny feature
extractor (no download); the other commands refuse an audio model in one line, and so does a checkpoint without its
feature extractor, a text model given recordings, an audio model given text or no recordings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.audio import save_whisper, write_wavs

runner = CliRunner()
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    write_wavs(folder, n=3)  # 0.25, 0.5 and 0.75 s: 4, 8 and 12 of the encoder's 16 frames hold audio
    return folder


def _one_line(result, *said: str) -> None:
    """Exit 2 with one ``error:`` line holding every part of ``said``."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in said:
        assert part in lines[0], result.output


def test_analyze_quick_on_audio_measures_time_padding_and_entropy(whisper, clips, tmp_path):
    result = runner.invoke(app, ["analyze", str(whisper), "--quick", "--audio", str(clips), "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    summary, rows = document["summary"], document["heads"]
    assert summary["items"] == 3 and summary["tokens"] == 4 + 8 + 12 and len(rows) == 6 * 4
    assert summary["timeline"] == {"positions": 16, "seconds": 0.0625}
    encoder, cross = rows[0], rows[3 * 4]  # L0 H0 (the encoder), L3 H0 (the first cross-attention)
    assert encoder["n_queries"] == 24 and 0 < encoder["time_distance"] < 0.75 and 0 < encoder["to_padding"] < 1
    assert 0 < encoder["entropy"] <= encoder["uniform_entropy"] + 1e-9 and encoder["to_self"] is not None
    assert cross["n_queries"] == 3 and cross["time_distance"] is None and 0 < cross["time_spread"] < 0.75
    assert "to_prev" not in encoder and encoder["pattern_class"] == ""
    skipped = summary["skipped"]
    for part in ("text statistics and roles", "pattern classes", "syntax", "causal probes", "importance",
                 "retrieval and streaming heads", "similarity of the decoder's and cross-attention heads"):
        assert skipped[part], part
    assert "transcript" in skipped["importance"] and "time_distance" in skipped["text statistics and roles"]
    assert len(document["sentences"]) == 3 and "padding beyond the audio" in document["sentences"][1]
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"heads.json", "heads.csv", "heatmaps.png", "mds.png"}


def test_analyze_prints_the_roles_and_what_it_skipped(whisper, clips, tmp_path):
    result = runner.invoke(app, ["analyze", str(whisper), "--quick", "--audio", str(clips / "clip0.wav"),
                                 "--out", str(tmp_path / "out")], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "1 recordings, 4 frames holding audio, 24 heads" in said and "Heads by role" in said
    assert "skipped pattern classes: Kovaleva" in said and "skipped importance: no audio task" in said


def test_view_writes_the_frames_the_token_and_each_heads_axes(whisper, clips, tmp_path):
    out = tmp_path / "x.html"
    result = runner.invoke(app, ["view", str(whisper), str(clips / "clip1.wav"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(re.search(r'id="viewer-data">(.*?)</script>', out.read_text()).group(1))
    [item] = payload["items"]
    assert item["text"] == "clip1.wav" and item["image"] is None and item["words"] is None
    assert item["frames"]["labels"][:2] == ["frame 0.00 s", "frame 0.06 s"] and item["frames"]["audio"] == 8
    assert item["pieces"]["labels"] == ["tok 0"]
    assert payload["axes"][0] == ["frames", "frames"] and payload["axes"][2 * 4] == ["tokens", "tokens"]
    assert payload["axes"][3 * 4] == ["tokens", "frames"]
    assert [item["pieces"]["patterns"][i]["m"] for i in (0, 2 * 4, 3 * 4)] == [16, 1, 16]
    assert "time_spread" in payload["info"][3 * 4]["stats"] and "time_distance" not in payload["info"][3 * 4]["stats"]
    assert "on 16 frames" in " ".join(result.output.split())


def test_a_whisper_with_its_head_transcribes_and_is_measured_on_its_transcripts(clips, tmp_path):
    whisper = save_whisper(tmp_path / "whisper", head=True)
    result = runner.invoke(app, ["analyze", str(whisper), "--quick", "--audio", str(clips), "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    summary, rows = document["summary"], document["heads"]
    assert summary["decoder"]["reads"] == "transcripts" and summary["decoder"]["mean_tokens"] > 1
    assert "importance" not in summary["skipped"] and summary["pruning_metrics"] == ["transcript agreement"]
    assert all(row["importance_gradient"] is not None for row in rows)
    assert rows[3 * 4]["time_order"] is not None and rows[0]["time_order"] is None  # cross heads only
    assert any("follows the audio most closely" in sentence for sentence in document["sentences"])
    out = tmp_path / "x.html"
    result = runner.invoke(app, ["view", str(whisper), str(clips / "clip1.wav"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(re.search(r'id="viewer-data">(.*?)</script>', out.read_text()).group(1))
    [item] = payload["items"]
    n = len(item["pieces"]["labels"])
    assert n > 1 and item["pieces"]["labels"][0] == "tok 0"  # the start token, then the transcript
    assert [item["pieces"]["patterns"][i]["m"] for i in (2 * 4, 3 * 4)] == [n, n]
    assert "time_order" in payload["info"][3 * 4]["stats"]


def test_an_audio_model_given_text_and_a_text_model_given_audio_are_refused(whisper, clips, tmp_path):
    out = ["--out", str(tmp_path / "x.html")]
    _one_line(runner.invoke(app, ["view", str(whisper), "a cat on a mat", *out]), "WhisperModel takes audio, not text")
    _one_line(runner.invoke(app, ["view", str(clips / "clip0.wav"), *out]),
              "'" + str(clips / "clip0.wav") + "' is an image, a recording", "(BertModel) reads text")
    _one_line(runner.invoke(app, ["analyze", str(whisper), "--quick", "--out", str(tmp_path / "a")]),
              "WhisperModel takes audio, and headlab bundles none: give a folder of WAV files with --audio FOLDER")
    _one_line(runner.invoke(app, ["analyze", "--quick", "--audio", str(clips), "--out", str(tmp_path / "b")]),
              "--audio is for an audio model", "(BertModel) reads text")
    _one_line(runner.invoke(app, ["analyze", str(whisper), "--audio", str(tmp_path / "none"), "--out",
                                  str(tmp_path / "c")]), "no such file or folder; expected a folder of WAV files")


def test_a_checkpoint_without_its_feature_extractor_names_the_file(clips, tmp_path):
    bare = save_whisper(tmp_path / "bare", processor=False)
    for command in (["view", str(bare), str(clips), "--out", str(tmp_path / "x.html")],
                    ["analyze", str(bare), "--audio", str(clips), "--out", str(tmp_path / "out")]):
        _one_line(runner.invoke(app, command), "has no preprocessor_config.json (the checkpoint's feature extractor): "
                                               "add it")


def test_the_other_commands_refuse_an_audio_model_in_one_line(whisper, tmp_path):
    refusal = "WhisperModel takes input_features, not text"
    for command in (["patch", str(whisper), "--clean", "a b", "--corrupt", "a c"],
                    ["circuit", str(whisper), "--clean", "a b", "--corrupt", "a c"],
                    ["report", str(whisper), "--quick", "--out", str(tmp_path / "report")],
                    ["bench", str(whisper), "--quick"]):
        _one_line(runner.invoke(app, command), refusal)
