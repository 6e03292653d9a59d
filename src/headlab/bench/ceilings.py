"""The machine: what it is, and its ceilings measured in the same run as the benchmarks.

Ceilings: the FLOP/s of one large matmul in the run's dtype (float32 on CPU, bfloat16 on
CUDA) and the bandwidth of one large copy (bytes read + written per second). Each attention
result is also given as a fraction of the matmul ceiling, with FLOPs from
``headlab.layer.accounting``.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.bench.timing import Timing, time_interleaved

__all__ = ["Ceilings", "describe_machine", "measure_ceilings"]


@dataclass(frozen=True)
class Ceilings:
    """The machine's measured ceilings.

    Attributes:
        device: where they were measured.
        dtype: the matmul's dtype.
        matmul_size: n of the n × n × n matmul (2n³ FLOPs).
        matmul: seconds per matmul.
        copy_bytes: bytes of the copied tensor (each copy reads and writes them).
        copy: seconds per copy.
    """

    device: str
    dtype: str
    matmul_size: int
    matmul: Timing
    copy_bytes: int
    copy: Timing

    @property
    def matmul_flops_per_s(self) -> float:
        """FLOP/s of the matmul (median round)."""
        return 2 * self.matmul_size**3 / self.matmul.median

    @property
    def copy_bytes_per_s(self) -> float:
        """Bytes moved per second by the copy (read + write, median round)."""
        return 2 * self.copy_bytes / self.copy.median

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields and the derived rates (JSON-ready)."""
        return {"device": self.device, "dtype": self.dtype, "matmul_size": self.matmul_size,
                "matmul": self.matmul.to_dict(), "copy_bytes": self.copy_bytes, "copy": self.copy.to_dict(),
                "matmul_flops_per_s": self.matmul_flops_per_s, "copy_bytes_per_s": self.copy_bytes_per_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ceilings:
        """The inverse of ``to_dict``."""
        return cls(device=data["device"], dtype=data["dtype"], matmul_size=int(data["matmul_size"]),
                   matmul=Timing.from_dict(data["matmul"]), copy_bytes=int(data["copy_bytes"]),
                   copy=Timing.from_dict(data["copy"]))


def measure_ceilings(*, device: str, dtype: torch.dtype, matmul_size: int, copy_mib: int, rounds: int,
                     min_block_s: float) -> Ceilings:
    """Time a large matmul and a large copy in interleaved rounds.

    Args:
        device: "cpu" or "cuda".
        dtype: the matmul's dtype (the copy is float32).
        matmul_size: n of the n × n matmul.
        copy_mib: size of the copied tensor in MiB.
        rounds, min_block_s: see ``time_interleaved``.

    Returns:
        The ceilings.
    """
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(matmul_size, matmul_size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(matmul_size, matmul_size, generator=generator).to(device=device, dtype=dtype)
    product = torch.empty(matmul_size, matmul_size, device=device, dtype=dtype)
    source = torch.ones(copy_mib * 2**20 // 4, device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    t = time_interleaved({"matmul": lambda: torch.mm(a, b, out=product), "copy": lambda: target.copy_(source)},
                         rounds=rounds, min_block_s=min_block_s, device=device)
    return Ceilings(device=device, dtype=str(dtype).removeprefix("torch."), matmul_size=matmul_size,
                    matmul=t["matmul"], copy_bytes=source.numel() * 4, copy=t["copy"])


def _cpu_model() -> tuple[str, str | None]:
    """(model name, physical cores) from /proc/cpuinfo where it exists."""
    name, cores = platform.processor() or platform.machine(), None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, cores
    physical = set()
    package = core = None
    for line in [*text.splitlines(), ""]:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
            name = value
        elif key == "physical id":
            package = value
        elif key == "core id":
            core = value
        elif not key and core is not None:  # end of one logical CPU's block
            physical.add((package, core))
            package = core = None
    return name, str(len(physical)) if physical else None


def describe_machine(device: str) -> dict[str, str]:
    """The machine as RESULTS.md names it: CPU model, cores, threads, versions, load average, GPU.

    Args:
        device: the run's device; for "cuda" the GPU's name and CUDA version are added.

    Returns:
        Label → text, in display order.
    """
    import headlab

    name, physical = _cpu_model()
    info = {"cpu": name}
    if physical is not None:
        info["physical cores"] = physical
    info["logical cpus"] = str(os.cpu_count())
    if hasattr(os, "sched_getaffinity"):
        info["cpus available"] = str(len(os.sched_getaffinity(0)))
    info["torch threads"] = str(torch.get_num_threads())
    info["cuda available"] = "yes" if torch.cuda.is_available() else "no"
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = str(torch.version.cuda)
    info["torch"] = torch.__version__
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    info["python"] = platform.python_version()
    info["headlab"] = headlab.__version__
    if hasattr(os, "getloadavg"):
        info["load average at start (1, 5, 15 min)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return info
