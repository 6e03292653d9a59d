"""Tokenize a corpus once, with offsets and word ids, truncating long items on the record.

Axis legend: ``pos`` word-piece positions of one item, special tokens included.

Truncation keeps the beginning of an item (the first ``max_length`` pieces, special tokens
included) and is never silent: every truncated item is listed in ``TokenizedCorpus.truncated``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TokenizedCorpus", "backend_tokenizer", "tokenize_corpus"]


@dataclass
class TokenizedCorpus:
    """A corpus tokenized once: one ``tokenizers.Encoding`` per item, in corpus order.

    Attributes:
        texts: the items' texts.
        encodings: per item: ids, offsets, word ids, tokens and special-token mask (after
            truncation, special tokens included).
        full_lengths: per item, its length in pieces before truncation.
        max_length: the truncation length, or None.
        pad_id: the id batches are padded with.
    """

    texts: Sequence[str]
    encodings: list[Any]
    full_lengths: list[int]
    max_length: int | None
    pad_id: int
    lengths: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = [len(e.ids) for e in self.encodings]

    def __len__(self) -> int:
        return len(self.encodings)

    @property
    def truncated(self) -> list[int]:
        """Corpus indices of the items cut to ``max_length``."""
        return [i for i, (n, full) in enumerate(zip(self.lengths, self.full_lengths)) if full > n]

    @property
    def n_tokens(self) -> int:
        """Pieces over the corpus after truncation, special tokens included."""
        return sum(self.lengths)


def backend_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind a Hugging Face fast tokenizer (or the argument itself).

    Raises:
        TypeError: the tokenizer is not a fast (Rust ``tokenizers``) one, so it has no offsets.
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not all(hasattr(backend, name) for name in ("encode_batch", "post_process", "no_truncation")):
        raise TypeError(
            f"capture needs a fast tokenizer (Hugging Face tokenizers, with offsets); got {type(tokenizer).__name__}"
        )
    return backend


def tokenize_corpus(tokenizer: Any, texts: Sequence[str], *, max_length: int | None = None) -> TokenizedCorpus:
    """Tokenize every item once, with the model's special tokens, truncating to ``max_length``.

    Args:
        tokenizer: a Hugging Face fast tokenizer, or a ``tokenizers.Tokenizer``.
        texts: the items.
        max_length: most pieces per item, special tokens included; None for no limit.

    Returns:
        The encodings, with each item's length before truncation.

    Raises:
        TypeError: the tokenizer is not a fast tokenizer.
        ValueError: ``max_length`` leaves no room for a piece besides the special tokens.
    """
    backend = backend_tokenizer(tokenizer)
    n_special = backend.post_processor.num_special_tokens_to_add(False) if backend.post_processor else 0
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length <= n_special):
        raise ValueError(f"max_length={max_length!r}; expected an int > {n_special} (the special tokens it must hold)")
    # Encode without special tokens, cut the content, then add the special tokens: the same
    # result as the tokenizer's own truncation, and the full length comes for free.
    encodings, full_lengths = [], []
    with _plain(backend):
        for encoding in backend.encode_batch(list(texts), add_special_tokens=False):
            full_lengths.append(len(encoding.ids) + n_special)
            if max_length is not None and len(encoding.ids) > max_length - n_special:
                encoding.truncate(max_length - n_special)
            encodings.append(backend.post_process(encoding))
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:  # e.g. GPT-2: any id serves, padded positions are masked
        pad_id = (backend.padding or {}).get("pad_id", 0)
    return TokenizedCorpus(texts, encodings, full_lengths, max_length, int(pad_id))


@contextlib.contextmanager
def _plain(backend: Any) -> Iterator[None]:
    """The backend tokenizer without its own truncation and padding while the block runs, its settings
    put back after (a deep copy instead costs tens of milliseconds per call: once per Ray shard)."""
    truncation, padding = backend.truncation, backend.padding
    backend.no_truncation()
    backend.no_padding()
    try:
        yield
    finally:
        if truncation is not None:
            backend.enable_truncation(**truncation)
        if padding is not None:
            backend.enable_padding(**padding)
