from pathlib import Path

import pytest

from headlab.capture import Corpus, load_corpus
from headlab.data import corpus_lines


def test_default_is_the_bundled_corpus():
    corpus = load_corpus()
    assert corpus.source == "bundled corpus"
    assert list(corpus) == corpus_lines()
    assert len(corpus) == len(corpus_lines()) > 300
    assert "items=" in repr(corpus) and corpus.texts[0] not in repr(corpus)  # repr stays short


def test_file_skips_and_counts_blank_lines(tmp_path: Path):
    path = tmp_path / "c.txt"
    path.write_text("first line\n\n   \nsecond line\r\nthird\n", encoding="utf-8")
    corpus = load_corpus(path)
    assert corpus.texts == ("first line", "second line", "third")
    assert corpus.blank_lines == 2
    assert load_corpus(str(path)).texts == corpus.texts
    assert corpus.to_dict() == {"source": str(path), "items": 3, "blank_lines": 2}


def test_list_and_corpus_pass_through():
    corpus = load_corpus(["a b", "c"])
    assert corpus.texts == ("a b", "c") and corpus.source == "list of 2 strings"
    assert load_corpus(corpus) is corpus
    assert isinstance(load_corpus(("x",)), Corpus)


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        ([], ValueError, "empty"),
        (["ok", ""], ValueError, "item 1 is empty"),
        (["ok", "  \t"], ValueError, "item 1 is empty or blank"),
        (["ok", 3], TypeError, "item 1 is a int"),
        (["ok", None], TypeError, "item 1 is a NoneType"),
        (b"bytes", TypeError, "got bytes"),
        (42, TypeError, "got int"),
        ("the cat sat on the mat", FileNotFoundError, r"pass a list: \[text\]"),
    ],
)
def test_bad_input_errors(source, error, match):
    with pytest.raises(error, match=match):
        load_corpus(source)


def test_bad_files(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="is a directory"):
        load_corpus(tmp_path)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(ValueError, match="no item: 3 line"):
        load_corpus(blank)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        load_corpus(latin)
