"""Files of one medium (images, recordings) given as paths, folders or objects already in memory, named: what
``headlab.models.images`` and ``headlab.models.audio`` both read before they decode anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Medium:
    """How one medium is found and named in messages.

    Attributes:
        suffixes: what a folder's files of it end in (any case).
        folder: a folder of it, for messages ("a folder of images").
        item: one file of it, for "holds no …" ("image file").
        missing: what a missing path was expected to be ("an image or a folder of images").
        nothing: what an empty input was expected to hold ("an image file, a folder of images or a PIL image").
        given: what an empty input lacks ("image").
    """

    suffixes: tuple[str, ...]
    folder: str
    item: str
    missing: str
    nothing: str
    given: str

    def files(self, folder: str | os.PathLike[str]) -> list[Path]:
        """The files of ``folder`` ending in one of ``suffixes`` (any case), sorted by name.

        Raises:
            NotADirectoryError: ``folder`` is not a directory.
            ValueError: it holds none.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder}: not a directory; expected {self.folder}")
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in self.suffixes)
        if not files:
            raise ValueError(f"{folder} holds no {self.item}; expected files ending in {', '.join(self.suffixes)}")
        return files

    def sources(self, items: Sequence[Any], *, in_memory: Callable[[Any, int], str | None]) -> list[tuple[str, Any]]:
        """Each item with its name, not read yet: a path as it is, a folder as its ``files``.

        Args:
            items: paths, folders and objects in memory.
            in_memory: the name of an item that is not a path (given its place among the sources so far), or
                None to take it as a path.

        Raises:
            FileNotFoundError: a path that does not exist.
            NotADirectoryError / ValueError: a folder without files (``files``); no item at all.
        """
        out: list[tuple[str, Any]] = []
        for item in items:
            name = None if isinstance(item, (str, os.PathLike)) else in_memory(item, len(out))
            if name is not None:
                out.append((name, item))
                continue
            path = Path(item).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"{path}: no such file or folder; expected {self.missing}")
            out += [(file.name, file) for file in (self.files(path) if path.is_dir() else [path])]
        if not out:
            raise ValueError(f"no {self.given} given; expected {self.nothing}")
        return out
