"""What the suite reports: comparisons of a contender with a peer timed in the same group.

A ``Comparison`` holds both timings; its ratio is the contender's median time over the
peer's (below 1: the contender is faster). A goal is a bound on that ratio, and, on the
device runs that have one, a floor on the fraction of the machine's measured FLOP/s
ceiling. A row of ``unit="bytes"`` compares peak memory instead (``headlab.bench.memory``):
its two ``Timing``s hold bytes, one sample per round. ``SuiteResult`` is one run: the machine,
its ceilings and every area's rows; it round-trips through JSON (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headlab.bench.ceilings import Ceilings
from headlab.bench.plan import Plan
from headlab.bench.timing import Timing

__all__ = ["UNITS", "Area", "Comparison", "SuiteResult"]

UNITS = ("s", "bytes")  # what a Comparison's two Timings hold: seconds per call, or peak bytes of a call


@dataclass(frozen=True)
class Comparison:
    """A contender against a peer timed in the same interleaved group.

    Attributes:
        case: the sizes compared, e.g. ``"batch 2 · pos 1024 · d_model 768 · 12 heads"``.
        contender: what is measured (usually headlab).
        peer: what it is measured against.
        contender_time: seconds per call of the contender.
        peer_time: seconds per call of the peer.
        goal: the contender / peer time ratio must be at most this, or None.
        flops: model FLOPs of one call (``headlab.layer.accounting``), the same work on both
            sides, or None.
        tokens: tokens processed by one call (throughput rows), or None.
        ceiling_goal: the contender must reach this fraction of the FLOP/s ceiling, or None.
        details: further numbers of the row (padding, batches, correlations …).
        unit: what ``contender_time`` and ``peer_time`` hold (``UNITS``): "s", seconds per call; or
            "bytes", the peak memory of a call above what was in use before it (no rates then).
    """

    case: str
    contender: str
    peer: str
    contender_time: Timing
    peer_time: Timing
    goal: float | None = None
    flops: int | None = None
    tokens: int | None = None
    ceiling_goal: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    unit: str = "s"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit={self.unit!r}; expected one of {UNITS}")

    @property
    def ratio(self) -> float:
        """Contender median time / peer median time (median bytes for a memory row)."""
        return self.contender_time.median / self.peer_time.median

    @property
    def speedup(self) -> float:
        """Peer time / contender time (above 1: the contender is faster)."""
        return self.peer_time.median / self.contender_time.median

    def flops_per_s(self, side: str = "contender") -> float | None:
        """FLOP/s of one side ("contender" or "peer"), or None without a FLOP count (or on a memory row)."""
        if self.flops is None or self.unit != "s":
            return None
        return self.flops / (self.contender_time if side == "contender" else self.peer_time).median

    def tokens_per_s(self, side: str = "contender") -> float | None:
        """Tokens/s of one side, or None without a token count (or on a memory row)."""
        if self.tokens is None or self.unit != "s":
            return None
        return self.tokens / (self.contender_time if side == "contender" else self.peer_time).median

    def fraction_of_ceiling(self, ceiling_flops_per_s: float, side: str = "contender") -> float | None:
        """The side's FLOP/s as a fraction of the machine's matmul ceiling, or None without FLOPs."""
        rate = self.flops_per_s(side)
        return None if rate is None else rate / ceiling_flops_per_s

    def met(self, ceiling_flops_per_s: float | None = None) -> bool | None:
        """Whether every goal of the row holds; None when the row has no goal.

        Args:
            ceiling_flops_per_s: the run's matmul ceiling, needed for ``ceiling_goal``.
        """
        checks = []
        if self.goal is not None:
            checks.append(self.ratio <= self.goal)
        if self.ceiling_goal is not None and ceiling_flops_per_s is not None:
            fraction = self.fraction_of_ceiling(ceiling_flops_per_s)
            checks.append(fraction is not None and fraction >= self.ceiling_goal)  # no FLOPs: not met
        return all(checks) if checks else None

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields and the derived ratio, speed-up and rates (JSON-ready)."""
        return {
            "case": self.case, "contender": self.contender, "peer": self.peer,
            "contender_time": self.contender_time.to_dict(), "peer_time": self.peer_time.to_dict(),
            "ratio": self.ratio, "speedup": self.speedup, "goal": self.goal, "flops": self.flops,
            "tokens": self.tokens, "ceiling_goal": self.ceiling_goal, "details": dict(self.details), "unit": self.unit,
            "contender_flops_per_s": self.flops_per_s("contender"), "peer_flops_per_s": self.flops_per_s("peer"),
            "contender_tokens_per_s": self.tokens_per_s("contender"), "peer_tokens_per_s": self.tokens_per_s("peer"),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Comparison:
        """The inverse of ``to_dict`` (derived numbers are recomputed, not read)."""
        return cls(
            case=data["case"], contender=data["contender"], peer=data["peer"],
            contender_time=Timing.from_dict(data["contender_time"]), peer_time=Timing.from_dict(data["peer_time"]),
            goal=data["goal"], flops=data["flops"], tokens=data["tokens"], ceiling_goal=data["ceiling_goal"],
            details=dict(data["details"]), unit=data.get("unit", "s"),  # runs stored before memory rows lack it
        )


@dataclass
class Area:
    """One benchmark area's rows.

    Attributes:
        name: stable key ("layer", "inspection", "decode", "capture", "analysis", "importance").
        title: heading in RESULTS.md and the report.
        description: what was run, generated from the plan.
        rows: the comparisons, in the order measured.
        notes: parts skipped and why, and findings worth stating.
        seconds: wall time of the area (set by the suite).
        error: ``"ExceptionType: message"`` when the area raised (the suite went on with the next
            one), else None.
    """

    name: str
    title: str
    description: str
    rows: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict."""
        return {"name": self.name, "title": self.title, "description": self.description,
                "rows": [r.to_dict() for r in self.rows], "notes": list(self.notes), "seconds": self.seconds,
                "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Area:
        """The inverse of ``to_dict``."""
        return cls(name=data["name"], title=data["title"], description=data["description"],
                   rows=[Comparison.from_dict(r) for r in data["rows"]], notes=list(data["notes"]),
                   seconds=float(data["seconds"]), error=data.get("error"))  # runs stored before errors lack it


@dataclass
class SuiteResult:
    """One run of the suite.

    Attributes:
        plan: what was measured.
        quick: whether the ``--quick`` budget ran.
        command: the command line that ran it.
        started: UTC start time, ISO 8601.
        seconds: wall time of the whole run.
        machine: the machine described (CPU, cores, threads, versions, load average …).
        ceilings: the machine's ceilings measured in this run.
        areas: every area's rows, in the order run.
    """

    plan: Plan
    quick: bool
    command: str
    started: str
    seconds: float
    machine: dict[str, str]
    ceilings: Ceilings
    areas: list[Area]

    def failed(self) -> list[Area]:
        """The areas that raised (``Area.error``)."""
        return [a for a in self.areas if a.error is not None]

    def goals(self) -> list[tuple[str, Comparison, bool]]:
        """``(area name, row, met)`` for every row that has a goal."""
        ceiling = self.ceilings.matmul_flops_per_s
        return [(a.name, r, met) for a in self.areas for r in a.rows if (met := r.met(ceiling)) is not None]

    def to_dict(self) -> dict[str, Any]:
        """Returns: the whole run as one JSON-ready document (``headlab bench --json``)."""
        goals = self.goals()
        return {
            "plan": self.plan.to_dict(), "quick": self.quick, "command": self.command, "started": self.started,
            "seconds": self.seconds, "machine": dict(self.machine), "ceilings": self.ceilings.to_dict(),
            "areas": [a.to_dict() for a in self.areas],
            "goals": {"met": sum(met for _, _, met in goals), "missed": sum(not met for _, _, met in goals)},
            "failed": [a.name for a in self.failed()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SuiteResult:
        """The inverse of ``to_dict``.

        Raises:
            ValueError: the document is not a suite result (a key is missing).
        """
        try:
            return cls(plan=Plan.from_dict(data["plan"]), quick=bool(data["quick"]), command=data["command"],
                       started=data["started"], seconds=float(data["seconds"]), machine=dict(data["machine"]),
                       ceilings=Ceilings.from_dict(data["ceilings"]),
                       areas=[Area.from_dict(a) for a in data["areas"]])
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a headlab bench result: {type(err).__name__}: {err}") from err
