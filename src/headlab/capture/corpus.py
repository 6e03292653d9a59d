"""A corpus: the texts a capture runs over, one item per entry, in a fixed order.

An item's corpus index is its position here; batching reorders items but every batch carries
the indices, so consumers can restore corpus order.

An encoder-decoder also reads a corpus of (source, target) pairs: a list of 2-tuples of texts, or a
pairs file (``load_corpus(path, pairs=True)``), one pair a line, source and target separated by a
tab. Its encoder reads the source, its decoder the target (``headlab.models.seq2seq``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

__all__ = ["MAX_ITEM_CHARS", "PAIRS_FORMAT", "Corpus", "ShortCorpus", "load_corpus", "read_text_file"]

PAIRS_FORMAT = "one pair a line, source and target separated by a tab"

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
        texts: the items, in corpus order (a corpus of pairs: their sources).
        source: where they came from: a file path, ``"bundled corpus"``, ``"list of N strings"`` or
            ``"list of N pairs"``.
        blank_lines: blank lines skipped while reading a file (0 for a list).
        targets: a corpus of (source, target) pairs: each item's target, in corpus order; None for texts.
    """

    texts: tuple[str, ...]
    source: str
    blank_lines: int = 0
    targets: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> str:
        return self.texts[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)

    def __repr__(self) -> str:
        pairs = ", pairs=True" if self.targets is not None else ""
        return f"Corpus(source={self.source!r}, items={len(self.texts)}, blank_lines={self.blank_lines}{pairs})"

    @property
    def pairs(self) -> list[tuple[str, str]] | None:
        """The (source, target) pairs in corpus order, or None for a corpus of texts."""
        return None if self.targets is None else list(zip(self.texts, self.targets))

    def to_dict(self) -> dict[str, object]:
        """Where the corpus came from and its size (not the texts); ``pairs: True`` for a corpus of pairs."""
        out: dict[str, object] = {"source": self.source, "items": len(self.texts), "blank_lines": self.blank_lines}
        return out if self.targets is None else out | {"pairs": True}


def load_corpus(source: str | os.PathLike[str] | Sequence[str] | Sequence[tuple[str, str]] | Corpus | None = None,
                *, pairs: bool = False) -> Corpus:
    """Load a corpus from a text file, a list of strings, a pairs file, a list of pairs, or headlab's bundled corpus.

    Args:
        source: None for the bundled corpus (``headlab.data``); a path (``str`` or
            ``PathLike``) to a UTF-8 text file with one item per line, blank lines skipped;
            a list or tuple of non-empty strings; a list or tuple of (source, target) pairs of
            non-empty strings; or a ``Corpus`` (returned as is).
        pairs: read the file as (source, target) pairs: one pair a line, source and target
            separated by a tab (a text line may hold tabs of its own, so a file is read as pairs
            only when asked).

    Returns:
        The corpus, items in file or list order (``Corpus.targets`` set for pairs).

    Raises:
        FileNotFoundError: the path does not exist (a ``str`` is always read as a path: pass
            ``[text]`` to capture one text).
        ValueError: the path is a directory; the file is not UTF-8 text (the message names the
            line and column of the first bad byte) or has a line longer than ``MAX_ITEM_CHARS``;
            a line of a pairs file without exactly one tab, or with an empty side (its number
            named); the corpus has no item; a list item is empty or blank; ``pairs`` without a file.
        TypeError: ``source`` or a list item has the wrong type.
    """
    if isinstance(source, Corpus):
        return source
    if pairs and not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"pairs=True reads a pairs file ({PAIRS_FORMAT}); got {type(source).__name__}: pass a list "
                         "of (source, target) tuples without it")
    if source is None:
        from headlab.data import corpus_lines

        return Corpus(tuple(corpus_lines()), "bundled corpus")
    if isinstance(source, (str, os.PathLike)):
        return _read_file(Path(source), hint=isinstance(source, str), pairs=pairs)
    if isinstance(source, (bytes, bytearray)) or not isinstance(source, Sequence):
        raise TypeError(
            f"corpus must be a path, a list of strings or of (source, target) pairs, a Corpus or None (the bundled "
            f"corpus); got {type(source).__name__}"
        )
    if source and all(isinstance(item, tuple) for item in source):
        return _pairs_list(cast(Sequence[tuple[str, str]], source))
    source = cast(Sequence[str], source)
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


def _pairs_list(items: Sequence[tuple[str, str]]) -> Corpus:
    """A corpus of the (source, target) tuples ``items``, each checked."""
    for i, item in enumerate(items):
        if len(item) != 2 or not all(isinstance(text, str) for text in item):
            raise TypeError(f"corpus item {i} is {item!r:.80}; expected a (source, target) tuple of two strings")
        for side, text in zip(("source", "target"), item):
            if not text.strip():
                raise ValueError(f"corpus item {i}: the {side} is empty or blank: {text!r}; expected text on both "
                                 "sides")
    return Corpus(tuple(s for s, _ in items), f"list of {len(items)} pairs", targets=tuple(t for _, t in items))


def _read_file(path: Path, *, hint: bool = False, pairs: bool = False) -> Corpus:
    if not path.exists():
        why = " (a str is read as a path; to capture one text, pass a list: [text])" if hint else ""
        expected = f"a UTF-8 pairs file, {PAIRS_FORMAT}" if pairs else "a UTF-8 text file, one item per line"
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist{why}; expected {expected}")
    lines = read_text_file(path).splitlines()
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_ITEM_CHARS:
            raise ValueError(
                f"corpus file {str(path)!r}, line {number}: {len(line):,} characters; expected at most "
                f"{MAX_ITEM_CHARS:,} per item (a model reads the first few thousand tokens of an item and the "
                "analyses report how many they truncated: split the text into lines, one item each)"
            )
    if pairs:
        return _split_pairs(path, lines)
    texts = tuple(line for line in lines if line.strip())
    if not texts:
        raise ValueError(f"corpus file {str(path)!r} has no item: {len(lines)} line(s), all blank; expected "
                         "one text per line")
    return Corpus(texts, str(path), blank_lines=len(lines) - len(texts))


def _split_pairs(path: Path, lines: list[str]) -> Corpus:
    """The pairs of a pairs file's ``lines`` (blank lines skipped), each line checked."""
    sources, targets = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        sides = line.split("\t")
        if len(sides) != 2:
            raise ValueError(f"pairs file {str(path)!r}, line {number}: {len(sides) - 1} tabs; expected exactly one "
                             f"between source and target ({PAIRS_FORMAT})")
        for side, text in zip(("source", "target"), sides):
            if not text.strip():
                raise ValueError(f"pairs file {str(path)!r}, line {number}: the {side} is empty; expected text on "
                                 "both sides of the tab")
        sources.append(sides[0])
        targets.append(sides[1])
    if not sources:
        raise ValueError(f"pairs file {str(path)!r} has no pair: {len(lines)} line(s), all blank; expected "
                         f"{PAIRS_FORMAT}")
    return Corpus(tuple(sources), str(path), blank_lines=len(lines) - len(sources), targets=tuple(targets))
