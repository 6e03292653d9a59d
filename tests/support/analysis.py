"""Hand-made capture batches and analysis results, for the tests of the accumulators and their sections.

Axis legend: patterns ``(batch, head, query_pos, key_pos)``; values ``(batch, head, pos, d_head)``;
``W_O`` per layer ``(head, d_head, d_model)``.
"""

from __future__ import annotations

import math
import types

import numpy as np
import torch

from headlab.analysis import STATISTICS
from headlab.analysis.analyze import AnalysisResult
from headlab.analysis.syntax import RelationAccuracy, SyntaxResult
from headlab.capture import CaptureBatch, LayerCapture
from headlab.heads import HeadTable


def make_batch(tokens: list[list[str]], layers: dict[int, torch.Tensor], *, heads: dict[int, tuple] | None = None,
               special: list[list[bool]] | None = None) -> CaptureBatch:
    """A CaptureBatch from token strings and ``{layer: (batch, head, pos, pos)}`` patterns (right-padded).
    Special tokens default to the pieces written ``[CLS]`` / ``[SEP]``."""
    lengths = [len(t) for t in tokens]
    batch, pos = len(tokens), max(lengths)
    mask = torch.zeros(batch, pos, dtype=torch.long)
    special_mask = torch.zeros(batch, pos, dtype=torch.bool)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        flags = special[row] if special else [t in ("[CLS]", "[SEP]") for t in tokens[row]]
        special_mask[row, :n] = torch.tensor(flags)
    return CaptureBatch(
        input_ids=torch.arange(batch * pos).view(batch, pos), attention_mask=mask, lengths=torch.tensor(lengths),
        offsets=torch.zeros(batch, pos, 2, dtype=torch.long), word_ids=torch.full((batch, pos), -1),
        special_tokens_mask=special_mask, corpus_indices=torch.arange(batch), truncated=torch.zeros(batch, dtype=bool),
        texts=[" ".join(t) for t in tokens], tokens=tokens,
        layers={layer: LayerCapture(layer=layer, heads=(heads or {}).get(layer, tuple(range(p.shape[1]))),
                                    pattern=p)
                for layer, p in layers.items()},
    )


def sentence(n: int) -> list[str]:
    """``[CLS] w1 … [SEP]`` with n pieces in all; the piece before [SEP] is a full stop."""
    return ["[CLS]", *[f"w{i}" for i in range(1, n - 2)], ".", "[SEP]"]


def patterns_of(kind: str, n: int, pad_to: int | None = None) -> torch.Tensor:
    """``(n, pad_to)`` one named pattern over n real keys (padded keys get zero)."""
    pad_to = pad_to or n
    p = torch.zeros(n, pad_to)
    if kind == "identity":
        p[:, :n] = torch.eye(n)
    elif kind == "previous":
        p[0, 0] = 1
        p[torch.arange(1, n), torch.arange(n - 1)] = 1
    elif kind == "next":
        p[torch.arange(n - 1), torch.arange(1, n)] = 1
        p[n - 1, n - 1] = 1
    elif kind == "uniform":
        p[:, :n] = 1 / n
    elif kind == "cls":
        p[:, 0] = 1
    elif kind == "sep":
        p[:, n - 1] = 1
    elif kind == "punct":
        p[:, n - 2] = 1
    else:
        raise ValueError(kind)
    return p


def hand_batch(lengths: list[int], *, heads: dict[int, tuple[int, ...]], d_head: int = 3, special_last: bool = True,
               seed: int = 0, causal: bool = False) -> CaptureBatch:
    """Random right-padded items: position 0 and (with ``special_last``) the last real position special;
    per layer, patterns over the real keys (NaN in padded query rows, as a model may leave) and values."""
    g = torch.Generator().manual_seed(seed)
    b, n = len(lengths), max(lengths)
    mask = torch.zeros(b, n, dtype=torch.long)
    special = torch.zeros(b, n, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        special[row, 0] = True
        special[row, length - 1] = special_last
    batch = CaptureBatch(input_ids=torch.zeros(b, n, dtype=torch.long), attention_mask=mask,
                         lengths=torch.tensor(lengths), offsets=torch.zeros(b, n, 2, dtype=torch.long),
                         word_ids=torch.full((b, n), -1), special_tokens_mask=special,
                         corpus_indices=torch.arange(b), truncated=torch.zeros(b, dtype=torch.bool),
                         texts=["x"] * b, tokens=[["t"] * length for length in lengths])
    allowed = mask.bool()[:, None, None, :].expand(b, 1, n, n)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    for layer, hs in heads.items():
        scores = torch.randn(b, len(hs), n, n, generator=g) * 2
        pattern = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1)
        pattern = torch.where(mask.bool()[:, None, :, None], pattern, math.nan)  # padded query rows: anything
        v = torch.randn(b, len(hs), n, d_head, generator=g)
        v[0, :, 0] *= 0.05  # a short value on item 0's first token, as [CLS] often has
        batch.layers[layer] = LayerCapture(layer=layer, heads=hs, pattern=pattern, v=v)
    return batch


def w_o(heads: dict[int, int], d_head: int = 3, d_model: int = 5, seed: int = 1) -> dict[int, torch.Tensor]:
    """Random per-head output projections ``{layer: (head, d_head, d_model)}`` for ``heads`` = {layer: n_heads}."""
    g = torch.Generator().manual_seed(seed)
    return {layer: torch.randn(n, d_head, d_model, generator=g) for layer, n in heads.items()}


def hand_result(*, causal, relations=(), pruning=None):
    """An ``AnalysisResult`` of two layers × two heads with hand-set statistics: L1 H0 is the
    previous-token head (0.8), L0 H1 the next-token head (0.6, 0 when causal)."""
    heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
    columns = {name: np.full(4, 0.1) for name in STATISTICS} | {"n_queries": np.full(4, 50.0)}
    columns["to_prev"] = np.array([0.1, 0.2, 0.8, 0.3])
    columns["to_next"] = np.zeros(4) if causal else np.array([0.1, 0.6, 0.2, 0.3])
    syntax = None if not relations else SyntaxResult(
        relations=list(relations), head_slots=heads, per_head={}, counts={r.relation: r.count for r in relations},
        min_count=1, items=10, arcs=sum(r.count for r in relations))
    return AnalysisResult(
        capture=types.SimpleNamespace(items=10, tokens=200, n_truncated=0, corpus={}, pattern_memory=None, blocked=0),
        surface=HeadTable(heads, columns),
        roles={(1, 0): ("previous_token",)}, taxonomy=None, classes=dict.fromkeys(heads, "vertical"),
        similarity=types.SimpleNamespace(heads=heads, distances=np.ones((4, 4)) - np.eye(4)),
        embedding=types.SimpleNamespace(stress=0.1), syntax=syntax, pruning=pruning or {}, causal=causal)


def relation(name, count, *, accuracy, baseline, head=(0, 1), direction="dep_to_head"):
    """A ``RelationAccuracy`` whose best head in ``direction`` is ``head`` with ``accuracy``; the other
    direction's best is L1 H1 with 0."""
    other = (1, 1)
    d2h, h2d = (head, other) if direction == "dep_to_head" else (other, head)
    return RelationAccuracy(name, count, d2h, accuracy if direction == "dep_to_head" else 0.0, h2d,
                            accuracy if direction == "head_to_dep" else 0.0, 1, baseline)
