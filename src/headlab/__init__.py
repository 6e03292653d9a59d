"""headlab: multi-head attention, head by head.

The public names load on first use (PEP 562), so that ``import headlab`` and the command
line's ``--help`` do not pay for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headlab.interop import from_torch, to_torch
    from headlab.capture import run_with_cache
    from headlab.models import attach, detach, load
    from headlab.layer import AttentionConfig, AttentionOutput, FactoredMatrix, KVCache, MultiHeadAttention

try:
    __version__ = version("headlab")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

_EXPORTS = {
    "AttentionConfig": "headlab.layer",
    "AttentionOutput": "headlab.layer",
    "FactoredMatrix": "headlab.layer",
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

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headlab' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
