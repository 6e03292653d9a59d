"""Each head's mean z over a corpus: what mean-ablation replaces a head's output with.

``MeanZ`` is an accumulator (update / merge / result) over capture batches; ``mean_z`` runs
a capture with it. Means are over real tokens only (padding excluded), accumulated in float64.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from headlab.capture.batch import CaptureBatch
from headlab.capture.run import capture
from headlab.layer.selection import HeadSelection
from headlab.models import HeadedModel, headed


class MeanZ:
    """Sums and counts of z per layer over real positions; ``result()`` gives the means."""

    def __init__(self) -> None:
        self.sums: dict[int, Tensor] = {}  # layer → (heads, d_head_v), float64
        self.counts: dict[int, int] = {}
        self.heads: dict[int, tuple[int, ...]] = {}

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry z)."""
        real = batch.attention_mask.bool()  # (batch, pos)
        for layer, taken in batch.layers.items():
            if taken.z is None:
                raise ValueError(f"layer {layer} was captured without z; capture with take=('z',)")
            z = taken.z.double() * real[:, None, :, None]  # (batch, head, pos, d_head_v)
            self._add(layer, taken.heads, z.sum(dim=(0, 2)), int(real.sum()))

    def merge(self, other: MeanZ) -> MeanZ:
        """Fold another accumulator's sums into this one (e.g. from another process); returns self."""
        for layer, total in other.sums.items():
            self._add(layer, other.heads[layer], total, other.counts[layer])
        return self

    def result(self) -> dict[int, Tensor]:
        """``{layer: mean z (heads, d_head_v)}``, heads in the captured order."""
        return {layer: self.sums[layer] / self.counts[layer] for layer in sorted(self.sums)}

    def _add(self, layer: int, heads: tuple[int, ...], total: Tensor, count: int) -> None:
        if layer in self.heads and self.heads[layer] != tuple(heads):
            raise ValueError(f"layer {layer}: heads {tuple(heads)} differ from the accumulated {self.heads[layer]}")
        self.heads[layer] = tuple(heads)
        self.sums[layer] = self.sums.get(layer, 0) + total.double().cpu()
        self.counts[layer] = self.counts.get(layer, 0) + count


def mean_z(model: HeadedModel | nn.Module, corpus: Any = None, *, heads: HeadSelection = None,
           **capture_options: Any) -> dict[int, Tensor]:
    """Every head's mean z over a corpus, for ``headlab.heads.mean_ablate``.

    Args:
        model: a ``HeadedModel`` with a tokenizer (or an attached model whose handle has one).
        corpus: as ``capture`` takes it; None for the bundled corpus.
        heads: a head selection (``headlab.heads.selection``); None for all. Every head of
            each selected layer is averaged, since ``mean_ablate`` takes a whole layer's means.
        capture_options: passed to ``capture`` (batch_tokens, max_length, progress, ...).

    Returns:
        ``{layer: (n_heads, d_head_v)}`` in the model's float dtype.
    """
    accumulator = MeanZ()
    layers = headed(model).heads(heads)
    capture(model, corpus=corpus, heads=dict.fromkeys(layers), take=("z",), consumers=[accumulator],
            **capture_options)
    return accumulator.result()
