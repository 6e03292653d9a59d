"""The attention layer: config, masks, math, projections, rotary, kv cache, module, factored QK/OV.

``headlab.layer`` imports nothing from the rest of headlab.
"""

from headlab.layer.cache import KVCache
from headlab.layer.config import AttentionConfig
from headlab.layer.factored import FactoredMatrix
from headlab.layer.module import AttentionOutput, MultiHeadAttention
from headlab.layer.rotary import RotaryEmbedding

__all__ = [
    "AttentionConfig",
    "AttentionOutput",
    "FactoredMatrix",
    "KVCache",
    "MultiHeadAttention",
    "RotaryEmbedding",
]
