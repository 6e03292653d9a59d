"""Head roles: labels read off surface statistics, and the causal-model probes on repeated tokens.

Axis legend:
    patterns   (batch, head, query_pos, key_pos)
    scores     HeadTable                           a row per (layer, head)

``label_heads`` turns the ``SurfaceStats`` result into labels with the thresholds below (Clark et al.
2019 for positional, special-token and broad heads). ``duplicate_token_scores`` and
``induction_scores`` run a causal model on ``[BOS] + r + r`` (r: ``length`` random tokens,
no token repeated within r) and read the second copy's attention (Olsson et al. 2022;
Wang et al. 2022). The rules are written out in docs/analysis.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab import display
from headlab.capture.cache import run_with_cache
from headlab.heads import HeadTable, head_label
from headlab.models import HeadedModel, headed
from headlab.models.handle import given_tokenizer

__all__ = [
    "BROAD", "DUPLICATE_TOKEN", "INDUCTION", "NEXT_TOKEN", "PREVIOUS_TOKEN", "PUNCTUATION", "SELF", "SINK", "SPECIAL",
    "ProbeScores", "duplicate_token_score", "duplicate_token_scores", "induction_score", "induction_scores",
    "label_heads", "previous_token_score", "probe_patterns", "repeated_tokens", "role_labels",
]

PREVIOUS_TOKEN = 0.5  # to_prev > this: a previous-token head
NEXT_TOKEN = 0.5  # to_next > this: a next-token head
SELF = 0.5  # to_self > this: a self head
SPECIAL = 0.5  # to_cls + to_sep > this: a special-token head ([CLS]/[SEP], BOS/EOS: Clark et al.'s no-op heads)
SINK = 0.5  # a share on the sink tokens above this: a sink head (the first positions; an image's [CLS] and registers)
PUNCTUATION = 0.3  # to_punct > this: a punctuation head (punctuation is ~10% of pieces)
BROAD = 0.9  # entropy ≥ this × uniform entropy: a broad head (attends nearly uniformly)
INDUCTION = 0.3  # induction score > this: an induction head
DUPLICATE_TOKEN = 0.3  # duplicate-token score > this: a duplicate-token head


def role_labels(result: HeadTable, layer: int, head: int) -> tuple[str, ...]:
    """The labels of one head of a ``SurfaceStats`` result, in a fixed order (possibly none).

    Raises:
        KeyError: the head is not in ``result``.
    """
    def stat(name: str) -> float:
        return result.value(name, layer, head)

    labels = []
    if stat("to_prev") > PREVIOUS_TOKEN:
        labels.append("previous_token")
    if stat("to_next") > NEXT_TOKEN:
        labels.append("next_token")
    if stat("to_self") > SELF:
        labels.append("self")
    if stat("to_cls") + stat("to_sep") > SPECIAL:
        labels.append("special")
    if stat("to_punct") > PUNCTUATION:
        labels.append("punctuation")
    if stat("entropy") >= BROAD * stat("uniform_entropy"):
        labels.append("broad")
    return tuple(labels)


def label_heads(result: HeadTable) -> dict[tuple[int, int], tuple[str, ...]]:
    """``{(layer, head): labels}`` for every head of a ``SurfaceStats`` result; a head may have several
    labels or none."""
    return {(layer, head): role_labels(result, layer, head) for layer, head in result.heads}


@dataclass(repr=False)
class ProbeScores(display.Shown):
    """One probe's score per head.

    Attributes:
        name: ``"duplicate_token"`` or ``"induction"``; also the name of ``table``'s column.
        table: a row per head of the model, column ``name``: mean attention to the probe's target, in [0, 1].
        threshold: the score above which a head is labelled.
        n_seqs, length, seed: the probe sequences (``[BOS] + r + r``, r of ``length`` tokens).
    """

    name: str
    table: HeadTable
    threshold: float
    n_seqs: int
    length: int
    seed: int

    def heads_above(self, threshold: float | None = None) -> list[tuple[int, int]]:
        """``(layer, head)`` whose score exceeds ``threshold`` (default: the probe's own), in table order."""
        threshold = self.threshold if threshold is None else threshold
        return [h for h, score in zip(self.table.heads, self.table[self.name]) if score > threshold]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "n_seqs": self.n_seqs, "length": self.length,
                "seed": self.seed, "heads": [list(h) for h in self.heads_above()], "rows": self.table.rows()}

    def _parts(self) -> list[str]:
        return [display.Html(self.table.html([self.name]))]

    def _title(self) -> str:
        return f"ProbeScores: {self.name} scores of {len(self.table)} heads"

    def _facts(self) -> list[tuple[str, object]]:
        above = [h for h in self.table.top(self.name) if h in set(self.heads_above())]
        named = ", ".join(f"{head_label(*h)} {display.short(self.table.value(self.name, *h))}" for h in above[:4])
        return [(f"above {display.short(self.threshold)}", f"{len(above)} heads" + (f": {named}" if named else "")
                 + (" …" if len(above) > 4 else "")),
                ("probe", f"{self.n_seqs} sequences of [BOS] + 2 × {self.length} random tokens, seed {self.seed}")]


def repeated_tokens(*, n_seqs: int, length: int, vocab_size: int, bos_id: int, exclude: Iterable[int] = (),
                    seed: int = 0) -> Tensor:
    """``(n_seqs, 1 + 2 × length)`` int64: ``[BOS] + r + r``, r ``length`` distinct tokens drawn
    from ``range(vocab_size)`` minus ``exclude`` and ``bos_id``.

    Raises:
        ValueError: fewer than ``length`` tokens to draw from, or a non-positive size.
    """
    if n_seqs < 1 or length < 2:
        raise ValueError(f"n_seqs={n_seqs}, length={length}; expected n_seqs ≥ 1 and length ≥ 2")
    pool = torch.tensor(sorted(set(range(vocab_size)) - set(exclude) - {bos_id}), dtype=torch.long)
    if len(pool) < length:
        raise ValueError(f"length={length} distinct tokens wanted but the vocabulary offers {len(pool)}")
    generator = torch.Generator().manual_seed(seed)
    r = torch.stack([pool[torch.randperm(len(pool), generator=generator)[:length]] for _ in range(n_seqs)])
    bos = torch.full((n_seqs, 1), bos_id, dtype=torch.long)
    return torch.cat([bos, r, r], dim=1)


def probe_patterns(model: HeadedModel | nn.Module, input_ids: Tensor) -> list[Tensor]:
    """Run a causal attached model on ``input_ids`` (no padding) and return every layer's patterns.

    Returns:
        Per layer, ``(batch, head, query_pos, key_pos)`` float32 on the CPU.

    Raises:
        ValueError: a layer is not causal (the probes read a left-to-right model).
    """
    handle = _causal(model)
    cache = run_with_cache(handle, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)})
    return [cache["pattern", layer].float().cpu() for layer in range(handle.n_layers)]


def _causal(model: HeadedModel | nn.Module) -> HeadedModel:
    """The model's handle, refused unless every layer is causal."""
    handle = headed(model)
    not_causal = [site.layer for site in handle.sites if not site.causal]
    if not_causal:
        raise ValueError(
            f"the duplicate-token and induction probes need a causal model; layers {not_causal} of "
            f"{handle.architecture} are not causal (bidirectional heads can read the second copy directly)"
        )
    return handle


def previous_token_score(patterns: Tensor) -> Tensor:
    """``(head,)``: mean attention from each position i ≥ 1 to i − 1, over batch and positions.

    Args:
        patterns: ``(batch, head, pos, pos)`` of self-attention over any sequences.
    """
    return patterns.diagonal(offset=-1, dim1=-2, dim2=-1).double().mean(dim=(0, 2))


def duplicate_token_score(patterns: Tensor, length: int) -> Tensor:
    """``(head,)``: mean attention from each second-copy position i to i − length (its duplicate).

    Args:
        patterns: ``(batch, head, 1 + 2 × length, key_pos)`` on ``[BOS] + r + r``.
    """
    return patterns.diagonal(offset=-length, dim1=-2, dim2=-1)[..., 1:].double().mean(dim=(0, 2))


def induction_score(patterns: Tensor, length: int) -> Tensor:
    """``(head,)``: mean attention from each second-copy position i to i − length + 1 (the token that
    followed the earlier occurrence)."""
    return patterns.diagonal(offset=-(length - 1), dim1=-2, dim2=-1)[..., 2:].double().mean(dim=(0, 2))


def duplicate_token_scores(model: HeadedModel | nn.Module, tokenizer: Any = None, *, n_seqs: int = 16,
                           length: int = 32, seed: int = 0) -> ProbeScores:
    """Each head's duplicate-token score on ``[BOS] + r + r``.

    Args:
        model: a causal ``HeadedModel`` or attached model. Its tokenizer gives the BOS id and the
            special ids to avoid; without one, the model config's ``bos_token_id`` and ``vocab_size``.
        tokenizer: deprecated: the handle holds the tokenizer (``headlab.attach(model, tokenizer=...)``).
        n_seqs: sequences; length: tokens in r; seed: the sampling seed.

    Returns:
        A row per head of the model, column ``"duplicate_token"``.

    Raises:
        ValueError: the model is not causal, has no BOS id / vocabulary size to draw from, or takes
            fewer than 1 + 2 × ``length`` positions.
    """
    return _probe("duplicate_token", duplicate_token_score, DUPLICATE_TOKEN, model, tokenizer, n_seqs, length, seed)


def induction_scores(model: HeadedModel | nn.Module, tokenizer: Any = None, *, n_seqs: int = 16,
                     length: int = 32, seed: int = 0) -> ProbeScores:
    """Each head's induction score on ``[BOS] + r + r`` (column ``"induction"``); arguments as
    ``duplicate_token_scores``."""
    return _probe("induction", induction_score, INDUCTION, model, tokenizer, n_seqs, length, seed)


def _probe(name: str, score: Callable[[Tensor, int], Tensor], threshold: float, model: HeadedModel | nn.Module,
           tokenizer: Any, n_seqs: int, length: int, seed: int) -> ProbeScores:
    # a bidirectional model: refused first
    handle = _causal(given_tokenizer(model, tokenizer, f"{name}_scores", depth=2))
    tokenizer = handle.tokenizer
    config = getattr(handle.model, "config", None)
    bos_id = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    bos_id = getattr(config, "bos_token_id", None) if bos_id is None else bos_id
    sizes = [n for n in (len(tokenizer) if tokenizer is not None else None, getattr(config, "vocab_size", None))
             if isinstance(n, int)]
    vocab_size = min(sizes) if sizes else None  # ids the tokenizer knows that the embedding also has
    if bos_id is None or vocab_size is None:
        raise ValueError(f"{name} probe: no BOS id ({bos_id}) or vocabulary size ({vocab_size}) found; "
                         "pass a tokenizer with bos_token_id")
    limit = handle.max_length
    if limit is not None and 1 + 2 * length > limit:
        raise ValueError(f"{name} probe: length={length} makes sequences of 1 + 2 × {length} = {1 + 2 * length} "
                         f"tokens but the model takes at most {limit}; use length ≤ {(limit - 1) // 2}")
    exclude = set(getattr(tokenizer, "all_special_ids", []) or [])
    exclude |= {i for i in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None))
                if isinstance(i, int)}
    input_ids = repeated_tokens(n_seqs=n_seqs, length=length, vocab_size=vocab_size, bos_id=bos_id,
                                exclude=exclude, seed=seed)
    per_layer = [score(p, length) for p in probe_patterns(handle, input_ids)]
    table = HeadTable([(layer, h) for layer, s in enumerate(per_layer) for h in range(len(s))],
                      {name: torch.cat(per_layer).numpy()})
    return ProbeScores(name=name, table=table, threshold=threshold, n_seqs=n_seqs, length=length, seed=seed)
