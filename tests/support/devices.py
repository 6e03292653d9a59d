"""The devices a test runs on: the CPU, and CUDA where there is a GPU."""

from __future__ import annotations

import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
