"""Exact weight import/export between headlab layers and other attention implementations.

``from_torch``/``to_torch`` exchange weights with ``torch.nn.MultiheadAttention``; ``swap``/
``export`` put headlab layers into (and back out of) Hugging Face transformers models, one
adapter per family (``hf_bert``, ``hf_gpt2``, ``hf_llama``), chosen by ``hf_registry`` from the
model's config class. transformers is imported only when an adapter is first used.
"""

from headlab.interop.hf_registry import export, supported, swap, swapped_layers, swapped_modules
from headlab.interop.torch_mha import ParityCase, from_torch, parity_suite, to_torch

__all__ = [
    "ParityCase",
    "export",
    "from_torch",
    "parity_suite",
    "supported",
    "swap",
    "swapped_layers",
    "swapped_modules",
    "to_torch",
]
