"""Peak memory of a call: a call that holds a large tensor at its peak shows it, one that holds nothing does
not, whatever an earlier call left; interleaved rounds give one sample per round."""

from __future__ import annotations

import pytest
import torch

from headlab.bench.memory import PAGE, peak_memory, peak_memory_available, peak_memory_interleaved

MIB = 2**20
needs_peak = pytest.mark.skipif(peak_memory_available() is not None, reason="peak memory cannot be measured here")


def _hold(mib: int):
    def once() -> None:
        block = torch.ones(mib * MIB // 4)  # float32: written, so resident
        del block
    return once


@needs_peak
def test_a_call_that_holds_a_tensor_at_its_peak_shows_it() -> None:
    held = peak_memory(_hold(64))
    assert 60 * MIB <= held <= 80 * MIB


@needs_peak
def test_memory_an_earlier_call_freed_does_not_hide_the_next_calls_peak() -> None:
    for _ in range(3):  # the C library may keep what was freed; each measurement gives it back first
        assert peak_memory(_hold(32)) >= 30 * MIB


@needs_peak
def test_a_call_that_holds_nothing_shows_little() -> None:
    assert PAGE <= peak_memory(lambda: None) < 4 * MIB


@needs_peak
def test_interleaved_rounds_give_one_sample_per_round() -> None:
    measured = peak_memory_interleaved({"small": _hold(8), "large": _hold(48)}, rounds=2)
    assert list(measured) == ["small", "large"]
    assert all(len(t.samples) == 2 for t in measured.values())
    assert measured["large"].median > 4 * measured["small"].median


@pytest.mark.parametrize(("fns", "rounds", "match"), [({}, 1, "at least one"), ({"a": lambda: None}, 0, "rounds=0")])
def test_bad_arguments_are_named(fns, rounds, match) -> None:
    with pytest.raises(ValueError, match=match):
        peak_memory_interleaved(fns, rounds=rounds)


def test_cuda_is_always_measurable() -> None:
    assert peak_memory_available("cuda") is None  # the allocator's counters (measured only where CUDA runs)
