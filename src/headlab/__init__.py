"""headlab: multi-head attention, head by head."""

from importlib.metadata import PackageNotFoundError, version

from headlab.interop import from_torch, to_torch
from headlab.layer import AttentionConfig, AttentionOutput, FactoredMatrix, KVCache, MultiHeadAttention

try:
    __version__ = version("headlab")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "AttentionConfig",
    "AttentionOutput",
    "FactoredMatrix",
    "KVCache",
    "MultiHeadAttention",
    "__version__",
    "from_torch",
    "to_torch",
]
