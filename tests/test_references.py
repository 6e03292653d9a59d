"""What the report, the code it shows and the docs cite can be followed from the repository: no
discussion thread outside it ("thread 000", "../seeds"), and every ``headlab.…`` name a docstring
gives exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "headlab"
OUTSIDE = re.compile(r"\.\./seeds|\bthreads? 0\d\d|\bthread[_-]0\d\d", re.IGNORECASE)
ROOMS = [PACKAGE]  # every module (the tests may name what must not appear)
DOCS = sorted((ROOT / "docs").glob("*.md"))
NAMED = re.compile(r"``(headlab(?:\.\w+)+)``")
FILES = (".json", ".safetensors")  # ``headlab.json``: a file a model folder holds, not a module


def _texts() -> list[Path]:
    return [f for room in ROOMS for f in sorted(room.rglob("*.py"))] + DOCS + [ROOT / "README.md"]


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_discussion_thread_outside_the_repository_is_cited(path: Path) -> None:
    found = [m.group(0) for m in OUTSIDE.finditer(path.read_text(encoding="utf-8"))]
    assert not found, f"{path.relative_to(ROOT)} cites {found}: state the question in words instead"


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_every_headlab_name_a_docstring_gives_exists() -> None:
    named = {(str(f.relative_to(ROOT)), m.group(1)) for f in sorted(PACKAGE.rglob("*.py"))
             for m in NAMED.finditer(f.read_text(encoding="utf-8")) if not m.group(1).endswith(FILES)}
    assert named, "no docstring names a headlab module: the pattern no longer matches"
    assert [(f, name) for f, name in sorted(named) if not _resolves(name)] == []
