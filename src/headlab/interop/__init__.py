"""Exact weight import/export between headlab layers and other attention implementations."""

from headlab.interop.torch_mha import ParityCase, from_torch, parity_suite, to_torch

__all__ = ["ParityCase", "from_torch", "parity_suite", "to_torch"]
