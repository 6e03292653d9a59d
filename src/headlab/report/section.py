"""What a report section is and what it gets to work with.

A section is a named function from a :class:`ReportContext` to an HTML fragment. It
computes its own numbers (seeded by ``ctx.seed``, smaller when ``ctx.quick``) and may
write asset files (JSON, images) into the report folder through the context.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["Section", "ReportContext"]

_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class ReportContext:
    """Everything a section may use while rendering.

    Attributes:
        out_dir: the report folder; ``index.html`` is written here.
        assets_dir: ``out_dir / "assets"``, for plots and other files a section links to.
        seed: seed for every random draw a section makes.
        quick: compute a smaller version (fewer cases, smaller sizes) for fast runs.
    """

    out_dir: Path
    assets_dir: Path
    seed: int
    quick: bool

    def write_file(self, relpath: str, content: str | bytes) -> str:
        """Write a file inside the report folder and return its link target.

        Args:
            relpath: POSIX path relative to ``out_dir``, e.g. ``"parity.json"`` or
                ``"assets/heads.svg"``; parent folders are created.
            content: text (written as UTF-8) or bytes.

        Returns:
            ``relpath`` as an href relative to ``index.html``.

        Raises:
            ValueError: ``relpath`` is absolute or leaves the report folder.
        """
        rel = PurePosixPath(relpath)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"asset path must be relative and stay inside the report folder, got {relpath!r}")
        path = self.out_dir.joinpath(*rel.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return rel.as_posix()


@dataclass(frozen=True)
class Section:
    """One part of the report.

    Attributes:
        id: stable anchor, lowercase letters, digits and dashes (``"parity"``).
        title: heading shown in the page and the table of contents.
        render: computes the section's numbers and returns its HTML fragment. Text in
            the fragment must be escaped (use :mod:`headlab.report.html`).
    """

    id: str
    title: str
    render: Callable[[ReportContext], str]

    def __post_init__(self) -> None:
        if not _ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"section id must match [a-z0-9][a-z0-9-]*, got {self.id!r}")
        if not self.title.strip():
            raise ValueError(f"section {self.id!r} needs a non-empty title")
