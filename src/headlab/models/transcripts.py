"""A recording's own transcript: what an audio encoder-decoder with a language-model head (Whisper's
``WhisperForConditionalGeneration``) writes for it, so that its decoder's and cross-attention heads are read over
text, as Whisper's alignment heads are (the cross heads whose attention moves through the audio as the transcript
moves through its words).

``transcribe`` decodes greedily: from ``config.decoder_start_token_id``, the most likely next token, until
``config.eos_token_id`` or ``max_tokens`` tokens. It is the model's own continuation of its start token, not
transformers' ``generate``: the generation config's forced and suppressed tokens (a language, the task,
timestamps) are not applied, so a multilingual Whisper writes its language and task tokens itself. A model whose
output is not logits (``WhisperModel``) has no transcript.

Notation: a transcript is ``[start, t_1, …, t_n]`` and, when the model stopped by itself, its end token
``[…, eos]``; the decoder reads the transcript without its end token (``Transcript.read``), and a loss on it
predicts every token after the start (``Transcript.ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.seq2seq import start_token

TRANSCRIPT_TOKENS = 32  # most tokens a transcript runs for, after its start token


@dataclass(frozen=True)
class Transcript:
    """One recording's greedy transcript.

    Attributes:
        ids: ``[start, t_1, …, t_n]``, then the end token when the model wrote it.
        ended: whether the model wrote its end token (else it was cut at ``max_tokens``).
    """

    ids: tuple[int, ...]
    ended: bool

    @property
    def read(self) -> tuple[int, ...]:
        """What the decoder reads: the transcript without its end token."""
        return self.ids[:-1] if self.ended else self.ids


def speaks(output: Any) -> bool:
    """Whether a forward's ``output`` holds logits (``.logits``): the model has a language-model head."""
    return isinstance(getattr(output, "logits", None), Tensor)


def transcribe(model: nn.Module, features: Tensor, *, max_tokens: int = TRANSCRIPT_TOKENS) -> list[Transcript] | None:
    """Each recording's greedy transcript (the module docstring), the model run as it is (heads masked, pruned).

    Args:
        model: an audio encoder-decoder (transformers' ``forward(input_features=, decoder_input_ids=)``), on the
            device of ``features``.
        features: ``(batch, n_mels, frames)``, in the model's dtype.
        max_tokens: most tokens after the start token (and fewer than the decoder's ``config.max_target_positions``);
            0 gives the start token alone.

    Returns:
        One ``Transcript`` per recording, or None when the model's output is not logits.

    Raises:
        ValueError: ``max_tokens`` below 0, or a config without ``decoder_start_token_id``.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise ValueError(f"max_tokens={max_tokens!r}; expected an int ≥ 0 (tokens after the start token)")
    config = getattr(model, "config", None)
    end, positions = getattr(config, "eos_token_id", None), getattr(config, "max_target_positions", None)
    if isinstance(positions, int):
        max_tokens = min(max_tokens, positions - 1)  # the decoder's positions hold the start token too
    ids = torch.full((len(features), 1), start_token(model), dtype=torch.long, device=features.device)
    done = torch.zeros(len(features), dtype=torch.bool, device=features.device)
    encoded = None
    with torch.no_grad():
        for step in range(max_tokens + 1):
            arguments = {"encoder_outputs": encoded} if encoded is not None else {"input_features": features}
            output = model(**arguments, decoder_input_ids=ids, use_cache=False)
            if not speaks(output):
                return None
            if encoded is None:
                encoded = (output.encoder_last_hidden_state,)
            if step == max_tokens or bool(done.all()):
                break
            following = output.logits[:, -1].argmax(-1)
            ids = torch.cat([ids, following[:, None]], dim=1)
            if isinstance(end, int):
                done |= following == end
    return [_transcript(row, end) for row in ids.tolist()]


def _transcript(row: Sequence[int], end: int | None) -> Transcript:
    """The transcript of one row of greedy ids: up to and with its first end token after the start."""
    stop = next((i for i in range(1, len(row)) if row[i] == end), None)
    return Transcript(tuple(row) if stop is None else tuple(row[: stop + 1]), ended=stop is not None)


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The decoder's tokens as a person reads them: the processor's tokenizer's pieces, or ``tok {id}`` without one.

    Args:
        tokenizer: a handle's tokenizer slot (a processor, which holds a tokenizer; a tokenizer; a feature
            extractor; or None).
        ids: the token ids.
    """
    words = getattr(tokenizer, "tokenizer", tokenizer)
    if callable(getattr(words, "convert_ids_to_tokens", None)):
        return list(words.convert_ids_to_tokens(list(ids)))
    return [f"tok {i}" for i in ids]
