"""Peak memory of a call: how much more it holds at its peak than was in use before it.

On CUDA, the caching allocator's peak (``torch.cuda.max_memory_allocated``, its counter reset before
the call) above what was allocated before. On CPU, the process's peak resident set size, the measure
the Ray area reports per worker (``peak_rss_bytes``), made resettable: Linux keeps it as ``VmHWM`` in
``/proc/self/status`` and resets it to the current RSS when ``5`` is written to
``/proc/self/clear_refs`` (Linux ≥ 4.0). Before each call the C library's free heap is given back to
the system (glibc's ``malloc_trim``; skipped elsewhere), so that memory freed by an earlier call does
not hide this call's growth; the peak still counts every allocation the call makes, tensors,
autograd's saved tensors and the allocator's slack alike, which is what the machine has to hold.
Where none of this is available (CPU on macOS or Windows), ``peak_memory_available`` says why.

Calls are measured in interleaved rounds like the timings (``headlab.bench.timing``), one sample
per round; a ``Timing`` holds the bytes (a ``Comparison`` with ``unit="bytes"``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path

import torch

from headlab.bench.timing import Timing, synchronize

__all__ = ["PAGE", "peak_memory", "peak_memory_available", "peak_memory_interleaved"]

PAGE = 4096  # the least a call is recorded to hold (a Timing's samples are positive)
_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def peak_memory_available(device: torch.device | str = "cpu") -> str | None:
    """None when ``peak_memory`` can measure on ``device``; else why not (a sentence)."""
    if torch.device(device).type == "cuda":
        return None
    try:
        _reset_cpu_peak()
        _status_kib("VmHWM")
    except (OSError, ValueError) as err:
        return (f"the process's peak resident memory cannot be reset here ({type(err).__name__}: {err}); it needs "
                "Linux's /proc/self/clear_refs and VmHWM")
    return None


def peak_memory(fn: Callable[[], object], *, device: torch.device | str = "cpu") -> int:
    """Bytes ``fn()`` holds at its peak above what was in use just before it (see the module docstring).

    Args:
        fn: a function of no arguments (its result is dropped before the next measurement).
        device: "cpu" (the process's resident memory) or "cuda" (the allocator's).

    Returns:
        The peak's growth in bytes, at least ``PAGE``.

    Raises:
        OSError, ValueError: on CPU, where the peak cannot be reset (``peak_memory_available`` says why).
    """
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return max(torch.cuda.max_memory_allocated(device) - before, PAGE)
    _trim()
    _reset_cpu_peak()
    before = _status_kib("VmHWM")  # = the resident set now, just reset
    fn()
    return max((_status_kib("VmHWM") - before) * 1024, PAGE)


def peak_memory_interleaved(fns: Mapping[str, Callable[[], object]], *, rounds: int,
                            device: torch.device | str = "cpu") -> dict[str, Timing]:
    """``peak_memory`` of each function in interleaved rounds (each round starts one function later).

    Args:
        fns: name → a function of no arguments.
        rounds: rounds to measure.
        device: as ``peak_memory`` takes it.

    Returns:
        name → a ``Timing`` whose samples are bytes (one per round), in the order of ``fns``.

    Raises:
        ValueError: no function, or ``rounds`` < 1.
    """
    if not fns:
        raise ValueError("peak_memory_interleaved needs at least one function")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r}; expected a positive int")
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            samples[name].append(float(peak_memory(fns[name], device=device)))
    return {name: Timing(samples=tuple(samples[name])) for name in names}


def _status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``)."""
    found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), flags=re.MULTILINE)
    if found is None:
        raise ValueError(f"{_STATUS} has no {field} field")
    return int(found.group(1))


def _reset_cpu_peak() -> None:
    """Set the process's peak resident set size (``VmHWM``) to its current one."""
    _CLEAR_REFS.write_text("5")


def _trim() -> None:
    """Give the C library's free heap back to the system (glibc), so the next call's growth shows in its RSS."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, when the process runs on it (it has ``malloc_trim``); else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None
