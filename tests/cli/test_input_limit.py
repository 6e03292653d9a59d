"""One rule for a text longer than the model's limit, at every entry point: it is cut to the limit, with the same
``TruncationWarning`` sentence (``headlab.models.handle.truncation_message``) from run_with_cache, patch, view and
analyze, on the packaged MiniLM (512 positions) and a text of about 1,500 pieces.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import headlab
from headlab.capture import TruncationWarning
from headlab.cli import app
from tests.support.minilm import minilm

LONG = " ".join(["heads attend to words"] * 375)  # 1,500 word pieces
SAID = ("1 of 1 inputs are longer than max_length=512 pieces (the model's limit, or the one asked for) and were cut "
        "to it (inputs 0)")


def _warned(output: str) -> list[str]:
    return re.findall(r"^warning: (.*)$", output, flags=re.MULTILINE)


def test_run_with_cache_cuts_a_long_text_to_the_limit():
    with pytest.warns(TruncationWarning, match=re.escape(SAID)):
        cache = headlab.run_with_cache(minilm(), LONG, take="z", heads={0: [0]})
    assert cache["z", 0, 0].shape[-2] == 512


def test_every_command_says_the_same(tmp_path):
    corpus = tmp_path / "long.txt"
    corpus.write_text(LONG + "\n", encoding="utf-8")
    runs = {
        "patch": ["patch", "--clean", "The cat " + LONG, "--corrupt", "The dog " + LONG, "--layers", "0",
                  "--heads", "0", "--out", str(tmp_path / "patch")],
        "view": ["view", LONG, "--out", str(tmp_path / "view.html")],
        "analyze": ["analyze", "--quick", "--no-syntax", "--text", str(corpus), "--out", str(tmp_path / "analyze")],
    }
    for name, args in runs.items():
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (name, result.output)
        assert set(_warned(result.output)) == {SAID}, (name, result.output)
        assert "Token indices sequence length" not in result.output, name
