"""The bundled sentence pairs (``pairs.tsv``), written for this project, for sentence-similarity tasks.

Each line is ``label<TAB>sentence_a<TAB>sentence_b`` with label one of ``paraphrase`` (same
meaning, different words), ``unrelated`` (different topic), ``near-miss`` (mostly the same words,
a different meaning: swapped roles, negation, a changed number or entity).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

__all__ = ["LABELS", "Pair", "load_pairs"]

LABELS = ("paraphrase", "unrelated", "near-miss")
_PAIRS = "pairs.tsv"


@dataclass(frozen=True)
class Pair:
    """One sentence pair and its label (one of ``LABELS``)."""

    label: str
    sentence_a: str
    sentence_b: str


def load_pairs(*, labels: tuple[str, ...] | None = None) -> list[Pair]:
    """The bundled pairs in file order.

    Args:
        labels: keep only these labels (None: all).

    Returns:
        One ``Pair`` per line.

    Raises:
        ValueError: a malformed line (its number and content are named) or an unknown label.
    """
    if labels is not None and not set(labels) <= set(LABELS):
        raise ValueError(f"labels {labels!r}: expected a subset of {LABELS}")
    text = (files("headlab.data") / _PAIRS).read_text(encoding="utf-8")
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3 or fields[0] not in LABELS or not all(f.strip() for f in fields[1:]):
            raise ValueError(f"{_PAIRS} line {number}: expected 'label<TAB>sentence_a<TAB>sentence_b' "
                             f"with label in {LABELS}, got {line!r}")
        pairs.append(Pair(*fields))
    return [p for p in pairs if labels is None or p.label in labels]
