"""Data bundled with headlab, written for this project (MIT, like the code; see README.md).

``corpus.txt``: 378 original English sentences and short paragraphs, one item per line, in
varied registers (narrative, technical, dialogue, news-like, instructions, questions, lists)
and lengths (3 words to paragraphs of about 200 word-pieces), with syntactic variety
(relative clauses, coordination, passives) for the syntax analyses.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["corpus_lines", "corpus_path"]

_CORPUS = "corpus.txt"


def corpus_path() -> Path:
    """The bundled corpus file's path on disk.

    Returns:
        The path of ``corpus.txt`` inside the installed package.

    Raises:
        RuntimeError: headlab is installed inside an archive (no file on disk): use
            ``corpus_lines()``.
    """
    resource = files(__name__) / _CORPUS
    if not isinstance(resource, Path):
        raise RuntimeError(f"the bundled corpus is not a file on disk ({resource!r}); read it with corpus_lines()")
    return resource


def corpus_lines() -> list[str]:
    """The bundled corpus, one string per item, in file order (blank lines skipped)."""
    text = (files(__name__) / _CORPUS).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]
