"""The machine described and its ceilings measured (positive rates; no timing asserted)."""

from __future__ import annotations

import torch

from headlab.bench import describe_machine, measure_ceilings


def test_ceilings_are_positive_rates_of_the_sizes_asked() -> None:
    c = measure_ceilings(device="cpu", dtype=torch.float32, matmul_size=48, copy_mib=1, rounds=2, min_block_s=1e-4)
    assert (c.matmul_size, c.copy_bytes, c.dtype) == (48, 2**20, "float32")
    assert c.matmul_flops_per_s == 2 * 48**3 / c.matmul.median > 0
    assert c.copy_bytes_per_s == 2 * 2**20 / c.copy.median > 0
    assert len(c.matmul.samples) == len(c.copy.samples) == 2


def test_machine_names_cpu_cores_threads_and_versions() -> None:
    info = describe_machine("cpu")
    assert info["torch threads"] == str(torch.get_num_threads())
    assert info["torch"] == torch.__version__
    assert info["cuda available"] == ("yes" if torch.cuda.is_available() else "no")
    assert info["cpu"] and int(info["logical cpus"]) >= 1
    assert "gpu" not in info
