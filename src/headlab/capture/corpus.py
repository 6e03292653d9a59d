"""A corpus: the texts a capture runs over, one item per entry, in a fixed order.

An item's corpus index is its position here; batching reorders items but every batch carries
the indices, so consumers can restore corpus order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_ITEM_CHARS", "Corpus", "ShortCorpus", "load_corpus", "read_text_file"]

# A line longer than this is refused rather than read: a model reads the first few thousand tokens
# of an item (the rest is truncated, and counted), so such a line is almost surely not one item.
MAX_ITEM_CHARS = 1_000_000


class ShortCorpus(ValueError):  # noqa: N818 - a public name, kept; callers catch it as a ValueError
    """The corpus holds too few tokens for what was asked of it (the message says how many it has and
    needs); a caller that runs several parts skips the one that raised it and says why."""


@dataclass(frozen=True)
class Corpus:
    """Texts to run a model over.

    Attributes:
        texts: the items, in corpus order.
        source: where they came from: a file path, ``"bundled corpus"`` or ``"list of N strings"``.
        blank_lines: blank lines skipped while reading a file (0 for a list).
    """

    texts: tuple[str, ...]
    source: str
    blank_lines: int = 0

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> str:
        return self.texts[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)

    def __repr__(self) -> str:
        return f"Corpus(source={self.source!r}, items={len(self.texts)}, blank_lines={self.blank_lines})"

    def to_dict(self) -> dict[str, object]:
        """Where the corpus came from and its size (not the texts)."""
        return {"source": self.source, "items": len(self.texts), "blank_lines": self.blank_lines}


def load_corpus(source: str | os.PathLike[str] | Sequence[str] | Corpus | None = None) -> Corpus:
    """Load a corpus from a text file, a list of strings, or headlab's bundled corpus.

    Args:
        source: None for the bundled corpus (``headlab.data``); a path (``str`` or
            ``PathLike``) to a UTF-8 text file with one item per line, blank lines skipped;
            a list or tuple of non-empty strings; or a ``Corpus`` (returned as is).

    Returns:
        The corpus, items in file or list order.

    Raises:
        FileNotFoundError: the path does not exist (a ``str`` is always read as a path: pass
            ``[text]`` to capture one text).
        ValueError: the path is a directory; the file is not UTF-8 text (the message names the
            line and column of the first bad byte) or has a line longer than ``MAX_ITEM_CHARS``;
            the corpus has no item; or a list item is empty or blank.
        TypeError: ``source`` or a list item has the wrong type.
    """
    if isinstance(source, Corpus):
        return source
    if source is None:
        from headlab.data import corpus_lines

        return Corpus(tuple(corpus_lines()), "bundled corpus")
    if isinstance(source, (str, os.PathLike)):
        return _read_file(Path(source), hint=isinstance(source, str))
    if isinstance(source, (bytes, bytearray)) or not isinstance(source, Sequence):
        raise TypeError(
            f"corpus must be a path, a list of strings, a Corpus or None (the bundled corpus); "
            f"got {type(source).__name__}"
        )
    for i, text in enumerate(source):
        if not isinstance(text, str):
            raise TypeError(f"corpus item {i} is a {type(text).__name__}, not a str: {text!r:.80}")
        if not text.strip():
            raise ValueError(f"corpus item {i} is empty or blank: {text!r}")
    if not source:
        raise ValueError("the corpus is empty: the list has no item")
    return Corpus(tuple(source), f"list of {len(source)} strings")


def read_text_file(path: Path) -> str:
    """The text of a UTF-8 file, refused with the file, line and column when it is not text.

    Args:
        path: the file.

    Returns:
        Its text.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the path is a directory, or the file is not UTF-8 text (an invalid byte or
            a NUL byte, as in a binary file); the message names the line and column.
    """
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist; expected a UTF-8 text file")
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory; expected a UTF-8 text file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = error.start
    else:
        bad = data.find(b"\0")
        if bad < 0:
            return text
    line, column = data.count(b"\n", 0, bad) + 1, bad - data.rfind(b"\n", 0, bad)
    raise ValueError(f"{str(path)!r} is not UTF-8 text: line {line}, column {column} holds byte 0x{data[bad]:02x}; "
                     "expected a UTF-8 text file")


def _read_file(path: Path, *, hint: bool = False) -> Corpus:
    if not path.exists():
        why = " (a str is read as a path; to capture one text, pass a list: [text])" if hint else ""
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist{why}; expected a UTF-8 text file, "
                                "one item per line")
    lines = read_text_file(path).splitlines()
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_ITEM_CHARS:
            raise ValueError(
                f"corpus file {str(path)!r}, line {number}: {len(line):,} characters; expected at most "
                f"{MAX_ITEM_CHARS:,} per item (a model reads the first few thousand tokens of an item and the "
                "analyses report how many they truncated: split the text into lines, one item each)"
            )
    texts = tuple(line for line in lines if line.strip())
    if not texts:
        raise ValueError(f"corpus file {str(path)!r} has no item: {len(lines)} line(s), all blank; expected "
                         "one text per line")
    return Corpus(texts, str(path), blank_lines=len(lines) - len(texts))
