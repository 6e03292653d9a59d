"""The tiny trainable model of the experiments: attention-only, built from headlab layers.

Axis legend:
    inputs    (batch, pos, field)             int64 symbols, one per field
    residual  (batch, pos, d_model)
    logits    (batch, pos, n_classes)
    pattern   (batch, head, query_pos, key_pos)  one tensor per layer

Each field has its own embedding table; the embeddings and a learned position embedding are
summed into the residual stream; every layer adds ``MultiHeadAttention(LayerNorm(residual))``;
a final LayerNorm and a linear unembedding give the logits. No MLPs: whatever the model
computes, its heads compute (the attention-only models of Elhage et al. 2021).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import Tensor, nn

from headlab.experiments.budget import check_seed
from headlab.experiments.tasks import Task
from headlab.layer import AttentionConfig, MultiHeadAttention

__all__ = ["ModelOutput", "TinyTransformer", "build_model"]


@dataclass
class ModelOutput:
    """What ``TinyTransformer.forward`` returns.

    Attributes:
        logits: ``(batch, pos, n_classes)``.
        pattern: per layer ``(batch, head, query_pos, key_pos)``, or None unless asked for.
    """

    logits: Tensor
    pattern: list[Tensor] | None = None


class TinyTransformer(nn.Module):
    """An attention-only transformer with causal headlab attention layers.

    Args:
        vocab_sizes: symbols per input field (one embedding table each).
        n_classes: output classes.
        max_len: positions the position embedding covers.
        layers: one ``AttentionConfig`` per layer, all of the same d_model; each is made causal.

    Raises:
        ValueError: no layers, layers of different widths, or a size that is not a positive int.
    """

    def __init__(self, *, vocab_sizes: Sequence[int], n_classes: int, max_len: int,
                 layers: Sequence[AttentionConfig]) -> None:
        super().__init__()
        layers = list(layers)
        if not layers:
            raise ValueError("layers is empty; give at least one AttentionConfig")
        widths = sorted({c.d_model for c in layers})
        if len(widths) != 1:
            raise ValueError(f"every layer needs the same d_model; got {widths}")
        for name, value in (("n_classes", n_classes), ("max_len", max_len), *(("vocab_sizes", v) for v in vocab_sizes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} has {value!r}; expected positive ints")
        if not vocab_sizes:
            raise ValueError("vocab_sizes is empty; give at least one input field")
        d_model = widths[0]
        self.embeddings = nn.ModuleList(nn.Embedding(v, d_model) for v in vocab_sizes)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.1)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in layers)
        self.attention = nn.ModuleList(MultiHeadAttention(replace(c, causal=True)) for c in layers)
        self.final_norm = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, n_classes)

    def forward(self, inputs: Tensor, *, return_pattern: bool = False) -> ModelOutput:
        """Run the model.

        Args:
            inputs: ``(batch, pos, field)`` int64, pos ≤ max_len; a model of one field also takes
                ``(batch, pos)`` (token ids, as ``headlab.capture`` hands them).
            return_pattern: also return every layer's attention patterns.

        Returns:
            A ``ModelOutput``.

        Raises:
            ValueError: inputs of the wrong shape, too many positions or a symbol out of range.
        """
        n_fields, max_len = len(self.embeddings), self.position.shape[0]
        if inputs.dim() == 2 and n_fields == 1:
            inputs = inputs[..., None]
        if inputs.dim() != 3 or inputs.shape[-1] != n_fields or inputs.shape[1] > max_len:
            raise ValueError(f"inputs has shape {tuple(inputs.shape)}; expected (batch, pos ≤ {max_len}, {n_fields})")
        residual = self.position[: inputs.shape[1]]
        for f, embedding in enumerate(cast(Sequence[nn.Embedding], self.embeddings)):
            symbols = inputs[..., f]
            if symbols.numel() and (symbols.min() < 0 or symbols.max() >= embedding.num_embeddings):
                raise ValueError(f"field {f} has symbols outside [0, {embedding.num_embeddings})")
            residual = residual + embedding(symbols)
        patterns: list[Tensor] | None = [] if return_pattern else None
        for norm, attention in zip(self.norms, self.attention):
            if patterns is not None:  # return_pattern
                out = attention(norm(residual), return_pattern=True)
                patterns.append(out.pattern)
                residual = residual + out.output
            else:
                residual = residual + attention(norm(residual))
        return ModelOutput(logits=self.unembed(self.final_norm(residual)), pattern=patterns)


def build_model(task: Task, layers: Sequence[AttentionConfig], *, seed: int) -> TinyTransformer:
    """A ``TinyTransformer`` sized for ``task``, its weights drawn from ``seed``.

    The weights are drawn from torch's global generator seeded with ``seed`` inside
    ``torch.random.fork_rng``, so the caller's generator state is left as it was.

    Raises:
        ValueError: a bad seed, or layers the model refuses.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(check_seed(seed))
        return TinyTransformer(vocab_sizes=task.vocab_sizes, n_classes=task.n_classes, max_len=task.seq_len,
                               layers=layers)
