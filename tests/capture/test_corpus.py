from pathlib import Path

import pytest

from headlab.capture import Corpus, load_corpus
from headlab.capture.corpus import MAX_ITEM_CHARS, read_text_file
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
    with pytest.raises(FileNotFoundError, match=r"missing\.txt' does not exist; expected a UTF-8 text file"):
        load_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="is a directory; expected a UTF-8 text file"):
        load_corpus(tmp_path)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(ValueError, match="no item: 3 line"):
        load_corpus(blank)


@pytest.mark.parametrize(("data", "where"), [
    ("first\ncaf\xe9\n".encode("latin-1"), "line 2, column 4 holds byte 0xe9"),  # Latin-1, not UTF-8
    (b"\xd5\x01binary", "line 1, column 1 holds byte 0xd5"),
    (b"text\nmore\n\x00\x00\n", "line 3, column 1 holds byte 0x00"),  # valid UTF-8, but a NUL: binary
    ("ok\n".encode("utf-16"), "line 1, column 1 holds byte 0xff"),  # UTF-16's byte-order mark
])
def test_a_file_that_is_not_utf8_text_is_named_with_its_line_and_column(tmp_path: Path, data: bytes, where: str):
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="is not UTF-8 text") as err:
        load_corpus(path)
    assert str(err.value) == f"{str(path)!r} is not UTF-8 text: {where}; expected a UTF-8 text file"


def test_a_line_longer_than_the_limit_is_refused_with_its_number(tmp_path: Path):
    path = tmp_path / "long.txt"
    path.write_text("short\n" + "x" * MAX_ITEM_CHARS + "\n" + "y" * (MAX_ITEM_CHARS + 1) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"long.txt', line 3: {MAX_ITEM_CHARS + 1:,} characters; expected at most "
                                         f"{MAX_ITEM_CHARS:,} per item"):
        load_corpus(path)
    path.write_text("short\n" + "x" * MAX_ITEM_CHARS + "\n", encoding="utf-8")
    assert [len(text) for text in load_corpus(path)] == [5, MAX_ITEM_CHARS]  # at the limit: read whole


def test_read_text_file_returns_the_whole_text(tmp_path: Path):
    path = tmp_path / "t.txt"
    path.write_text("two\nlines\n", encoding="utf-8")
    assert read_text_file(path) == "two\nlines\n"
