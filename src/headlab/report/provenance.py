"""Where and how a report was produced: versions, machine, seed, time, command."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["Provenance", "collect_provenance"]


@dataclass(frozen=True)
class Provenance:
    """The facts needed to reproduce (or distrust) a report's numbers."""

    headlab_version: str
    torch_version: str
    torch_threads: int
    python_version: str
    platform: str
    cpu: str
    cpu_count: int
    seed: int
    quick: bool
    utc_time: str
    command: str

    def to_dict(self) -> dict[str, object]:
        """Returns: the fields as a JSON-ready dict."""
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        """Returns: (label, value) pairs for display, in reading order."""
        return [
            ("headlab", self.headlab_version),
            ("torch", f"{self.torch_version} ({self.torch_threads} threads)"),
            ("python", self.python_version),
            ("platform", self.platform),
            ("CPU", f"{self.cpu} ({self.cpu_count} logical cores)"),
            ("seed", str(self.seed)),
            ("quick", "yes" if self.quick else "no"),
            ("time (UTC)", self.utc_time),
            ("command", self.command),
        ]


def _headlab_version() -> str:
    try:
        return metadata.version("headlab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _cpu_name() -> str:
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo names the model.
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def collect_provenance(*, seed: int, quick: bool, command: str | None = None) -> Provenance:
    """Describe the current run.

    Args:
        seed: the report's seed.
        quick: whether the report ran in quick mode.
        command: the command line to show; defaults to this process's ``sys.argv``.

    Returns:
        A :class:`Provenance` stamped with the current UTC time.
    """
    import torch  # heavy; only needed once a report is actually built

    return Provenance(
        headlab_version=_headlab_version(),
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        python_version=platform.python_version(),
        platform=platform.platform(),
        cpu=_cpu_name(),
        cpu_count=os.cpu_count() or 0,
        seed=seed,
        quick=quick,
        utc_time=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        command=command if command is not None else shlex.join(sys.argv),
    )
