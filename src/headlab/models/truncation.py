"""The one rule for inputs longer than a model takes: they are cut to its limit and every entry point (capture,
analyze, view, ``HeadedModel.inputs`` and so run_with_cache, patch and circuit) says so in the same sentence, as a
``TruncationWarning``: texts beyond ``max_length`` pieces (``truncation_message``), recordings beyond the feature
extractor's window (``cut_message``)."""

from __future__ import annotations

from collections.abc import Sequence


class TruncationWarning(UserWarning):
    """Inputs were cut to the model's limit (``max_length``, or an audio model's window); a capture's
    ``CaptureResult.truncated`` lists them all."""


def truncation_message(truncated: Sequence[int], items: int, max_length: int | None) -> str:
    """The sentence said when texts were cut to ``max_length`` pieces: how many of ``items``, and which."""
    return (f"{len(truncated)} of {items} inputs are longer than max_length={max_length} pieces (the model's limit, or "
            f"the one asked for) and were cut to it (inputs {_shown(truncated)})")


def cut_message(cut: Sequence[int], items: int, seconds: float) -> str:
    """The sentence said when recordings were cut to the feature extractor's window of ``seconds`` (Whisper: 30)."""
    return (f"{len(cut)} of {items} recordings are longer than the feature extractor's window of {seconds:g} s (what "
            f"the encoder takes) and were cut to it (recordings {_shown(cut)})")


def _shown(indices: Sequence[int]) -> str:
    return ", ".join(map(str, indices[:10])) + (" …" if len(indices) > 10 else "")
