"""The data files ``analyze`` writes (``AnalysisResult.write`` calls ``write_data`` with its parts).

    heads.json     ``AnalysisResult.to_dict()`` as strict JSON (NaN → null), indented
    heads.csv      one row per head (``AnalysisResult.rows()``; fields in docs/analysis.md)
    relations.csv  syntax's rows, when syntax ran
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from headlab.analysis.syntax import SyntaxResult

__all__ = ["jsonable", "write_data"]


def write_data(out: Path, *, document: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
               syntax: SyntaxResult | None) -> list[Path]:
    """heads.json, heads.csv and (with ``syntax``) relations.csv into the folder ``out`` (made already).

    Args:
        document: what heads.json holds (``AnalysisResult.to_dict()``).
        rows: heads.csv's rows, every row with the same fields (``AnalysisResult.rows()``).
        syntax: ``SyntaxAccuracy``'s result, or None.

    Returns:
        The paths, in that order.
    """
    paths = [out / "heads.json", out / "heads.csv"]
    paths[0].write_text(json.dumps(jsonable(document), indent=2) + "\n")
    with paths[1].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if syntax is not None:
        paths.append(out / "relations.csv")
        syntax.to_csv(paths[-1])
    return paths


def jsonable(value: Any) -> Any:
    """NaN → None, numpy scalars → Python, tuples → lists (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
