"""What a report section is, how sections are grouped, and what they get to work with.

A section is a named function from a :class:`ReportContext` to an HTML fragment. It
computes its own numbers (seeded by ``ctx.seed``, smaller when ``ctx.quick``) and may
write asset files (JSON, images) into the report folder through the context. A
:class:`Part` groups sections under one heading (one question about heads, such as "do heads share
Q/K/V weights?", the model's heads, ...); the page and its table of contents follow the parts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["Part", "Section", "ReportContext"]

_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class ReportContext:
    """Everything a section may use while rendering.

    Attributes:
        out_dir: the report folder; ``index.html`` is written here.
        assets_dir: ``out_dir / "assets"``, for plots and other files a section links to.
        seed: seed for every random draw a section makes.
        quick: compute a smaller version (fewer cases, smaller sizes) for fast runs.
        model: the checkpoint the model sections study (directory or hub id); None for the
            packaged MiniLM.
        text: the corpus file they run over; None for the bundled corpus.
    """

    out_dir: Path
    assets_dir: Path
    seed: int
    quick: bool
    model: str | None = None
    text: Path | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """Compute a value once per report and share it between sections (the loaded model, the
        analysis result): the first call runs ``compute``, later calls return its value.

        Args:
            key: the value's name, e.g. ``"model"``.
            compute: called without arguments on the first request.

        Returns:
            The value.
        """
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def memoized(self, key: str) -> Any | None:
        """The value a section already computed under ``key``, or None (nothing is computed)."""
        return self._memo.get(key)

    def load_model(self) -> Any:
        """``headlab.load(self.model)``, loaded once per report.

        Returns:
            The ``HeadedModel``.
        """
        import headlab  # heavy: torch and transformers

        return self.memo("model", lambda: headlab.load(self.model))

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


@dataclass(frozen=True)
class Part:
    """Sections under one heading, with a short introduction.

    Attributes:
        id: stable anchor, like a section id.
        title: the heading (in the table of contents too).
        intro: plain text shown under the heading (escaped when rendered).
        sections: the sections, in page order.
        see_also: ids of sections elsewhere in the page that bear on this part too.
    """

    id: str
    title: str
    intro: str
    sections: tuple[Section, ...]
    see_also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"part id must match [a-z0-9][a-z0-9-]*, got {self.id!r}")
        if not self.title.strip():
            raise ValueError(f"part {self.id!r} needs a non-empty title")
        object.__setattr__(self, "sections", tuple(self.sections))
        object.__setattr__(self, "see_also", tuple(self.see_also))
