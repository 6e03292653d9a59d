"""The package's imports: no cycle between its modules or its rooms (lazy imports inside functions
and ``TYPE_CHECKING`` blocks count too), dependencies pointing the one way DESIGN draws them, and the
rooms reachable from ``import headlab`` alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
# DESIGN's order (cli → report → (circuits, analysis, audit, experiments, bench) → (capture, heads) → models →
# interop → layer), made total where rooms of one group use each other: capture reads the heads' interventions,
# experiments, the benchmarks and circuits use analysis, and the benchmarks time circuits. A room may import
# rooms of a lower rank only.
RANK = {"data": 0, "display": 0, "layer": 0, "interop": 1, "models": 2, "heads": 3, "capture": 4, "analysis": 5,
        "audit": 5, "circuits": 6, "experiments": 6, "bench": 7, "report": 8, "cli": 9}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((SRC / "headlab").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in it: ``from headlab.a import b`` names the
    module ``headlab.a.b`` when there is one, else the package ``headlab.a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & set(known)
            found |= named or {node.module}
            if len(named) < len(node.names):  # some names are the package's own attributes
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items() if name != "headlab"}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, as the nodes along it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def room(module: str) -> str:
    return module.split(".")[1]


def test_no_module_imports_itself_round_about():
    edges = graph()
    # A package importing its own submodules is how a room exports names; a submodule importing its own
    # room's package back would close a cycle through it, and counts.
    assert cycle(edges) is None, " → ".join(cycle(edges) or [])


def test_rooms_import_only_downwards():
    # ``import headlab`` (the root, whose names load lazily) is left out: what it exports is checked where it lives.
    wrong = sorted(f"{a} imports {b}" for a, targets in graph().items() for b in targets
                   if b != "headlab" and room(a) != room(b) and RANK[room(b)] >= RANK[room(a)])
    assert not wrong, "\n".join(wrong)


def test_every_room_is_ranked():
    assert {room(m) for m in modules() if m != "headlab"} <= set(RANK)


def test_cycle_finder_finds_a_planted_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (["a", "b", "c", "a"],)
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", ["capture", "heads", "analysis", "models", "layer"])
def test_a_room_is_there_after_import_headlab_alone(name):
    # A fresh interpreter: nothing else has imported the room before.
    code = f"import headlab, sys; assert 'torch' not in sys.modules; m = headlab.{name}; print(m.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"headlab.{name}"
