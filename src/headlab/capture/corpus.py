"""A corpus: the texts a capture runs over, one item per entry, in a fixed order.

An item's corpus index is its position here; batching reorders items but every batch carries
the indices, so consumers can restore corpus order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "load_corpus"]


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
        ValueError: the file is not UTF-8 or a directory, the corpus has no item, or a list
            item is empty or blank.
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


def _read_file(path: Path, *, hint: bool = False) -> Corpus:
    if not path.exists():
        why = " (a str is read as a path; to capture one text, pass a list: [text])" if hint else ""
        raise FileNotFoundError(f"corpus file not found: {str(path)!r:.200}{why}")
    if path.is_dir():
        raise ValueError(f"corpus path {str(path)!r} is a directory; expected a text file with one item per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"corpus file {str(path)!r} is not UTF-8 text: {error}") from None
    lines = text.splitlines()
    texts = tuple(line for line in lines if line.strip())
    if not texts:
        raise ValueError(f"corpus file {str(path)!r} has no item: {len(lines)} line(s), all blank")
    return Corpus(texts, str(path), blank_lines=len(lines) - len(texts))
