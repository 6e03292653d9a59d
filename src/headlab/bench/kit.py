"""The GPU kit: what a GPU machine needs for ``headlab bench --device cuda`` that its image may lack.

A lent GPU machine typically comes with PyTorch and transformers but not the packaged default model,
and what travels to it is small. The CUDA plan runs in bfloat16 (``plan_for("cuda")``), so the kit
holds the default model loaded in that dtype and saved (``headlab.heads.save``): half the size, and
loaded in that dtype it is the same model to the bit (the cast happens before saving instead of after
loading). ``headlab bench .gpu/all-MiniLM-L6-v2 --device cuda`` then runs every model area on it, and names it
as the default model (``KIT_RECORD`` says what it is: ``is_kit``), as a CPU run on the packaged model does.

    python -m headlab.bench.kit .gpu        # or: make gpu-kit

docs/benchmarks.md gives the whole GPU run (benchmarks/gpu.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch

from headlab.bench.plan import plan_for

__all__ = ["KIT_MODEL", "KIT_RECORD", "is_kit", "write_kit"]

KIT_MODEL = "all-MiniLM-L6-v2"  # the kit's folder for the default model
KIT_RECORD = "headlab-kit.json"  # in that folder: which model it is a copy of, and in which dtype


def write_kit(folder: str | os.PathLike[str], *, dtype: torch.dtype | None = None) -> Path:
    """Write the default model, loaded in ``dtype``, into ``folder / KIT_MODEL`` (``headlab.heads.save``).

    Args:
        folder: created if missing; an existing ``KIT_MODEL`` in it is replaced.
        dtype: the weights' dtype; None for the CUDA plan's (bfloat16).

    Returns:
        The checkpoint directory, for ``headlab bench``'s MODEL, with ``KIT_RECORD`` beside the weights.

    Raises:
        ModuleNotFoundError: the default model is not installed (``headlab[models]``).
        ValueError: ``dtype`` is not a floating-point dtype.
    """
    import headlab
    from headlab.heads import save
    from headlab.models.loading import DEFAULT_PACKAGE

    dtype = plan_for("cuda", quick=False).torch_dtype if dtype is None else dtype
    if not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype}; expected a floating-point dtype, e.g. torch.bfloat16")
    target = Path(folder) / KIT_MODEL
    if target.exists():
        shutil.rmtree(target)
    saved = save(headlab.load(dtype=dtype), target)
    (saved / KIT_RECORD).write_text(json.dumps({"model": DEFAULT_PACKAGE, "dtype": str(dtype).removeprefix("torch.")}))
    return saved


def is_kit(source: str | os.PathLike[str]) -> bool:
    """Whether ``source`` is a kit's copy of the default model (``write_kit``: its ``KIT_RECORD`` names it)."""
    from headlab.models.loading import DEFAULT_PACKAGE

    try:
        record = json.loads((Path(source) / KIT_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("model") == DEFAULT_PACKAGE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headlab.bench.kit", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="where to write the kit (e.g. .gpu, ignored by git)")
    target = write_kit(parser.parse_args(argv).folder)
    size = sum(f.stat().st_size for f in target.iterdir())
    print(f"wrote {target} ({size / 2**20:.1f} MiB); on the GPU machine: headlab bench {target} --device cuda")


if __name__ == "__main__":
    main()
