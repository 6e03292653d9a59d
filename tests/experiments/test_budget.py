"""Seeds and numbers of steps: defaults, quick defaults, refusals that name the value."""

from __future__ import annotations

import pytest
import torch

from headlab.experiments.budget import check_seed, resolve_steps, single_thread


def test_steps_default_quick_and_given():
    assert resolve_steps(None, default=10, quick_default=3, quick=False) == 10
    assert resolve_steps(None, default=10, quick_default=3, quick=True) == 3
    assert resolve_steps(7, default=10, quick_default=3, quick=True) == 7


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_bad_steps(bad):
    with pytest.raises(ValueError, match=f"steps={bad!r} must be a positive int"):
        resolve_steps(bad, default=10, quick_default=3, quick=False)


def test_seeds():
    assert check_seed(0) == 0 and check_seed(2**63 - 1) == 2**63 - 1
    for bad in (-1, 2**63, "1", False):
        with pytest.raises(ValueError, match=r"seed=.* must be an int in \[0, 2\*\*63\)"):
            check_seed(bad)


def test_single_thread_is_scoped():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with single_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), single_thread():
            raise RuntimeError("restored even on error")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
