"""headlab: multi-head attention, head by head.

The public names and the rooms (``headlab.capture``, ``headlab.heads``, ``headlab.analysis``, …) load
on first use (PEP 562), so that ``import headlab`` and the command line's ``--help`` do not pay for
importing torch, and ``import headlab; headlab.heads.mask(...)`` works without importing the room first.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names __getattr__ loads, for type checkers (`import x as x`: re-exported)
    from headlab.capture import run_with_cache as run_with_cache
    from headlab.interop import from_torch as from_torch
    from headlab.interop import to_torch as to_torch
    from headlab.layer import AttentionConfig as AttentionConfig
    from headlab.layer import AttentionOutput as AttentionOutput
    from headlab.layer import FactoredMatrix as FactoredMatrix
    from headlab.layer import KVCache as KVCache
    from headlab.layer import MultiHeadAttention as MultiHeadAttention
    from headlab.models import HeadedModel as HeadedModel
    from headlab.models import detach as detach
    from headlab.models import load as load
    from headlab.models.attach import attach as attach  # its module: mypy took headlab.models.attach for it
    from headlab.report.viewer import show as show

try:
    __version__ = version("headlab")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

_EXPORTS = {
    "AttentionConfig": "headlab.layer",
    "AttentionOutput": "headlab.layer",
    "FactoredMatrix": "headlab.layer",
    "HeadedModel": "headlab.models",
    "KVCache": "headlab.layer",
    "MultiHeadAttention": "headlab.layer",
    "attach": "headlab.models",
    "detach": "headlab.models",
    "from_torch": "headlab.interop",
    "load": "headlab.models",
    "run_with_cache": "headlab.capture",
    "show": "headlab.report.viewer",
    "to_torch": "headlab.interop",
}

# The rooms of the package, imported when first named (``headlab.capture.mean_z(...)``).
_ROOMS = ("analysis", "audit", "bench", "capture", "circuits", "data", "experiments", "heads", "interop", "layer",
          "models", "report")

__all__ = [*_EXPORTS, *_ROOMS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _ROOMS:
        return import_module(f"headlab.{name}")  # importing a submodule sets it on the package
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headlab' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
