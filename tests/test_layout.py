"""The tests' own layout: a test imports the library, third-party packages and tests/support, nothing else.

No module under tests/ imports a test module (``test_*``) or a conftest, and none imports a module
of ``tests`` outside ``tests.support`` (a helper two rooms need lives in tests/support; fixtures
reach tests through conftest.py, never through an import). Read with ``ast`` from the sources:
``import``, ``from … import`` (relative ones resolved), and ``__import__`` / ``import_module``
with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = "tests.support"


def _module_name(path: Path) -> str:
    """``tests/bench/test_records.py`` → ``tests.bench.test_records`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of everything ``source`` (the module ``module``) imports. ``from a import b``
    gives ``a.b``, as ``b`` may be a module; relative imports are resolved against ``module``'s package."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base) for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module"))
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def forbidden(name: str) -> str | None:
    """Why importing the dotted ``name`` from a test is not allowed, or None."""
    parts = name.split(".")
    if any(part.startswith("test_") or part == "conftest" for part in parts):
        return "a test module or conftest"
    if parts[0] == "tests" and len(parts) > 1 and ".".join(parts[:2]) != SUPPORT:
        return "a module of tests/ outside tests/support"
    return None


def _sources() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def test_no_module_imports_a_test_module_or_a_helper_outside_tests_support() -> None:
    offences, from_support = [], 0
    for path in _sources():
        module = _module_name(path)
        for line, name in imported(path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py"):
            why = forbidden(name)
            if why:
                offences.append(f"{path.relative_to(TESTS.parent)}:{line} imports {name}: {why}")
            from_support += name.startswith(SUPPORT + ".")
    assert not offences, "move what is shared into tests/support:\n" + "\n".join(offences)
    assert from_support > 50  # the walk saw the tests' imports of tests/support


def test_the_walk_finds_every_form_of_import() -> None:
    source = "\n".join([
        "import tests.bench.test_records",
        "from tests.analysis.test_surface import make_batch",
        "from tests.capture import conftest",
        "from tests import bench",
        "from .test_page import thing",
        "from . import reference",
        "import test_viewer_page",
        "x = __import__('tests.models.tiny', fromlist=['A'])",
        "y = importlib.import_module('tests.layer.reference')",
        "from tests.support.tiny import build",
        "from tests import support",
        "import headlab.capture",
    ])
    names = [name for _, name in imported(source, "tests.report.viewer.test_data")]
    assert names[:6] == ["tests.bench.test_records", "tests.analysis.test_surface.make_batch",
                         "tests.capture.conftest", "tests.bench", "tests.report.viewer.test_page.thing",
                         "tests.report.viewer.reference"]
    assert [forbidden(name) is not None for name in names] == [True] * 9 + [False] * 3
