"""Patterns in row blocks: memory linear in the length where whole patterns would not fit.

    pattern_budget(max_pattern_memory, device) -> bytes      the most pattern bytes a batch may hold at once
    whole_pattern_bytes(items, positions, selection, itemsize) -> bytes
    over_budget(batches, selection, itemsize, budget) -> why | None   the plan's largest batch against the budget
    check_block_readers(consumers)                           refuse consumers that need whole patterns

A batch's whole patterns are ``Σ_layers items × heads × positions² × itemsize`` bytes: at 32k positions one
head's are 4 GiB in float32. Where that exceeds the budget, ``capture`` sets its taps to keep each layer's
patterns as ``headlab.layer.pattern_rows.PatternRows`` (q, k, the mask and the kernel's log-sum-exp: linear
in the length) in ``LayerCapture.pattern_rows``, ``pattern`` None, and hands its consumers the batch as any
other. A consumer that reads the patterns in row blocks says so (``READS_ROW_BLOCKS = True``) and gives the
whole patterns' result: the row reductions (``headlab.analysis.reductions``) come from one sweep of small row
blocks (``headlab.analysis.sweep``: ``SurfaceStats``, ``SinkShare``, ``ValueWeighted``), and a reader of the
rows themselves forms them a block at a time, each at most ``BLOCK_BYTES`` (``HeadSimilarity``'s sampled rows).
A consumer that needs whole patterns at once is refused before any forward.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import torch

from headlab.display import format_bytes

__all__ = ["BLOCK_BYTES", "PATTERN_MEMORY_SHARE", "available_memory", "check_block_readers", "over_budget",
           "pattern_budget", "whole_pattern_bytes"]

PATTERN_MEMORY_SHARE = 0.25  # without max_pattern_memory: this share of the device's free memory
# A block of rows formed at once at most, whatever the budget: a larger block only holds more memory (with 5.7 GiB
# blocks, analyze of a 32k text peaked at 12 GiB).
BLOCK_BYTES = 1 << 28


def available_memory(device: torch.device) -> int:
    """Bytes free on ``device``: the GPU's free memory, or the host's available memory (``MemAvailable`` of
    /proc/meminfo; where there is none, the physical memory's free pages)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pattern_budget(max_pattern_memory: int | None, device: torch.device) -> int:
    """The most bytes of patterns a batch may hold at once: ``max_pattern_memory``, or ``PATTERN_MEMORY_SHARE`` of
    what ``device`` has free when it is None.

    Raises:
        ValueError: ``max_pattern_memory`` is not a positive int.
    """
    if max_pattern_memory is None:
        return int(PATTERN_MEMORY_SHARE * available_memory(device))
    if isinstance(max_pattern_memory, bool) or not isinstance(max_pattern_memory, int) or max_pattern_memory < 1:
        raise ValueError(f"max_pattern_memory={max_pattern_memory!r}; expected a positive number of bytes")
    return max_pattern_memory


def whole_pattern_bytes(items: int, positions: int, selection: Mapping[int, Sequence[int]], itemsize: int) -> int:
    """Bytes of a batch's whole patterns: ``items × heads × positions² × itemsize`` over the selected layers."""
    return sum(items * len(heads) * positions * positions * itemsize for heads in selection.values())


def over_budget(batches: Sequence[Sequence[int]], selection: Mapping[int, Sequence[int]], itemsize: int,
                budget: int) -> str | None:
    """Why the patterns go in row blocks, in words (the largest batch's whole patterns, over ``budget``), or None
    where every batch's fit.

    Args:
        batches: each batch's item lengths.
        selection: ``{layer: heads}`` captured.
        itemsize: bytes per pattern element (the model's dtype).
        budget: ``pattern_budget``.
    """
    if not batches:
        return None
    largest = max(batches, key=lambda lengths: whole_pattern_bytes(len(lengths), max(lengths), selection, itemsize))
    need = whole_pattern_bytes(len(largest), max(largest), selection, itemsize)
    if need <= budget:
        return None
    return (f"a batch of {len(largest)} × {max(largest):,} positions has {format_bytes(need)} of patterns, over the "
            f"budget of {format_bytes(budget)}")


def check_block_readers(consumers: Iterable[object], *, why: str) -> None:
    """Refuse, naming them, the consumers that cannot read patterns in row blocks (no ``READS_ROW_BLOCKS``).

    Args:
        consumers: what a capture hands its batches to.
        why: why blocks are needed (the batch, its patterns' size and the budget), for the message.

    Raises:
        ValueError: a consumer needs whole patterns.
    """
    refused = sorted({type(c).__name__ for c in consumers if not getattr(c, "READS_ROW_BLOCKS", False)})
    if refused:
        raise ValueError(f"{why}, so the patterns go in row blocks, which {', '.join(refused)} cannot read (it needs "
                         "whole patterns): raise max_pattern_memory, lower max_length or batch_tokens, or leave it out")
