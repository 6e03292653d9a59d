"""Where and how a report was produced: versions, machine, model, corpus, seed, time, command, and
where every number came from.

Sections compute their numbers in the run, except those that show numbers stored by another run
(the performance section reads benchmarks/RESULTS.json, measured by ``headlab bench``, perhaps on
another machine). Such a section records what it read with ``record_source``; the provenance
paragraph (``Provenance.statement``) then names each of them beside "computed by this run".
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MODEL_NAME", "SOURCES_KEY", "Provenance", "ReadSource", "collect_provenance", "model_name",
           "record_source", "sources_read"]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2 (packaged)"
SOURCES_KEY = "sources read"  # the ReportContext memo holding the ReadSources of the sections


@dataclass(frozen=True)
class ReadSource:
    """Numbers a section shows that this run did not compute.

    Attributes:
        section: the section's title.
        path: the file they were read from.
        measured: by what, where and when they were measured, e.g. "headlab bench on Intel Xeon
            (2 logical CPUs), 2026-11-23T17:40:23+00:00".
    """

    section: str
    path: str
    measured: str


def record_source(ctx: Any, source: ReadSource) -> None:
    """Note on the report's context that a section shows numbers read from ``source``.

    Args:
        ctx: the ``ReportContext`` the section renders with.
        source: what was read.
    """
    ctx.memo(SOURCES_KEY, list).append(source)


def sources_read(ctx: Any) -> tuple[ReadSource, ...]:
    """Every ``ReadSource`` the sections recorded on ``ctx``, in the order they rendered."""
    return tuple(ctx.memoized(SOURCES_KEY) or ())


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
    model: str
    model_source: str
    corpus: str
    seed: int
    quick: bool
    utc_time: str
    command: str
    read: tuple[ReadSource, ...] = ()

    def statement(self) -> str:
        """Where the page's numbers come from: computed by this run, except the sections listed in ``read``."""
        if not self.read:
            return ("Every number above was computed by the run described here; rerunning the command with the same "
                    "seed on the same software reproduces it.")
        others = "; ".join(f"those of \u201c{r.section}\u201d, read from {r.path} and measured by {r.measured}"
                           for r in self.read)
        return (f"Every number above was computed by the run described here except {others}. Rerunning the command "
                "with the same seed on the same software reproduces the numbers it computed.")

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
            ("model", self.model),
            ("model source", self.model_source),
            ("corpus", self.corpus),
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


def model_name(source: str | None) -> str:
    """A short name for a model: the packaged MiniLM by name, a local checkpoint by its folder's
    name, a hub id as it is.

    Args:
        source: ``HeadedModel.source`` (or the argument given to ``headlab.load``); None for the
            packaged model.
    """
    if source is None:
        return DEFAULT_MODEL_NAME
    try:
        from headlab.models import default_model_path

        if Path(source) == default_model_path():
            return DEFAULT_MODEL_NAME
    except ModuleNotFoundError:  # the packaged model is not installed, so this is not it
        pass
    path = Path(source)
    if path.is_dir():
        return path.name if path.name != "model" else f"{path.parent.name}/{path.name}"
    return source


def collect_provenance(
    *, seed: int, quick: bool, model: str = DEFAULT_MODEL_NAME, model_source: str = "not loaded",
    corpus: str = "bundled corpus", command: str | None = None, read: tuple[ReadSource, ...] = (),
) -> Provenance:
    """Describe the current run.

    Args:
        seed: the report's seed.
        quick: whether the report ran in quick mode.
        model: the model the model sections studied, as it should be shown.
        model_source: where it was loaded from.
        corpus: the corpus they ran over, as it should be shown.
        command: the command line to show; defaults to this process's ``sys.argv``.
        read: numbers the sections read rather than computed (``sources_read``).

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
        model=model,
        model_source=model_source,
        corpus=corpus,
        seed=seed,
        quick=quick,
        utc_time=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        command=command if command is not None else shlex.join(sys.argv),
        read=tuple(read),
    )
