"""What the suite measures on which device: sizes, rounds and budgets, full or ``--quick``.

CPU runs float32 at 128, 1k and 2k positions; CUDA runs bfloat16 and adds 4k positions
(the GPU goal is stated there). Batches shrink as positions grow so that every case is a
few thousand tokens; the tiny causal model of the models area runs ``causal_shape``.
The circuits area runs the default model at ``circuit_tokens`` and times exact edge patching on a
seeded sample of ``circuit_edges`` edges. The large-model area builds a random Llama of ``large_model``'s
layers and width (``headlab.bench.large``: 1B-class shapes in the full run) and runs it on ``large_shape``.
The long-context area runs a tiny LLaMA-shaped model at ``long_context_lengths`` (4k, 16k and 32k positions in the
full run), its statistics' patterns kept as ``PatternRows`` where whole they would take more than
``long_context_pattern_memory`` bytes.
``--quick`` keeps every benchmark but drops the longest positions, halves the batches and takes fewer
rounds and a slice of the corpus (and a much smaller large model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["Plan", "plan_for"]


@dataclass(frozen=True)
class Plan:
    """Sizes and budgets of one run of the suite.

    Attributes:
        device: "cpu" or "cuda".
        dtype: name of the torch dtype every layer and model runs in.
        d_model, n_heads: the layer benchmarks' width and heads (BERT-base: 768, 12).
        layer_shapes: ``(batch, positions)`` of the layer and inspection cases.
        gqa_kv_heads: key/value heads of the grouped-query cases (1 = multi-query).
        gqa_shape: ``(batch, positions)`` of the grouped-query cases.
        decode_context: cached positions before decoding starts.
        decode_steps: tokens decoded one by one per timed call.
        rounds: interleaved rounds of the layer, inspection and decoding groups.
        min_block_s: shortest timed block of calls in those groups.
        corpus_items: items of the bundled corpus for capture (None: all).
        capture_rounds: rounds of the capture group (each call is a pass over the corpus).
        hf_batch_size: items per batch of the plain Hugging Face forward (corpus order).
        analysis_items: corpus items for the accumulator group (None: all).
        analysis_rounds: rounds of the accumulator group.
        importance_pairs: paraphrase pairs for importance (None: all).
        matmul_size: n of the n × n matmul that measures the FLOP/s ceiling.
        copy_mib: MiB copied to measure the memory bandwidth ceiling.
        ceiling_goal_positions: positions at which the forward must reach ``ceiling_goal``.
        ceiling_goal: fraction of the matmul ceiling the attention forward must reach there.
        causal_shape: ``(batch, positions)`` of the tiny causal model in the models area.
        circuit_tokens: tokens of the circuits area's clean and corrupted inputs.
        circuit_edges: edges of the seeded sample that the circuits area scores by exact edge patching (its
            time over every edge is extrapolated from them); None for every edge.
        memory_rounds: rounds of peak-memory measurements (each call measured once per round).
        large_model: ``(layers, d_model)`` of the large-model area's random Llama (its heads, key/value heads and
            intermediate size follow from d_model: ``headlab.bench.large.large_config``).
        large_shape: ``(batch, positions)`` of that model's forwards.
        long_context_lengths: positions of the long-context area's texts (batch 1), increasing.
        long_context_pattern_memory: its statistics' ``max_pattern_memory`` (bytes of whole patterns a batch may
            hold: above it, ``PatternRows`` read in row blocks).
        long_context_rounds: its interleaved rounds (each call timed and its peak memory measured at once).
    """

    device: str
    dtype: str
    d_model: int
    n_heads: int
    layer_shapes: tuple[tuple[int, int], ...]
    gqa_kv_heads: tuple[int, ...]
    gqa_shape: tuple[int, int]
    decode_context: int
    decode_steps: int
    rounds: int
    min_block_s: float
    corpus_items: int | None
    capture_rounds: int
    hf_batch_size: int
    analysis_items: int | None
    analysis_rounds: int
    importance_pairs: int | None
    matmul_size: int
    copy_mib: int
    ceiling_goal_positions: int | None = None
    ceiling_goal: float | None = None
    causal_shape: tuple[int, int] = (4, 512)
    circuit_tokens: int = 128  # defaults: runs stored before the circuits area lack these
    circuit_edges: int | None = 200
    memory_rounds: int = 3
    large_model: tuple[int, int] = (2, 512)  # defaults: runs stored before the large-model area lack these
    large_shape: tuple[int, int] = (1, 32)
    long_context_lengths: tuple[int, ...] = (64, 128, 256)  # defaults: runs stored before that area lack these
    long_context_pattern_memory: int = 2**18
    long_context_rounds: int = 1

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as a ``torch.dtype``."""
        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The inverse of ``to_dict``."""
        data = dict(data)
        data["layer_shapes"] = tuple(tuple(s) for s in data["layer_shapes"])
        data["gqa_kv_heads"] = tuple(data["gqa_kv_heads"])
        data["gqa_shape"] = tuple(data["gqa_shape"])
        # runs stored before their areas lack them
        for name in ("causal_shape", "large_model", "large_shape", "long_context_lengths"):
            if name in data:
                data[name] = tuple(data[name])
        return cls(**data)


def plan_for(device: str, *, quick: bool) -> Plan:
    """The suite's plan for a device.

    Args:
        device: "cpu" or "cuda".
        quick: the smoke-run budget (under 2 minutes on a 2-core CPU).

    Returns:
        The plan.

    Raises:
        ValueError: an unknown device.
    """
    if device == "cpu":
        return Plan(
            device="cpu", dtype="float32", d_model=768, n_heads=12,
            layer_shapes=((8, 128), (1, 1024)) if quick else ((16, 128), (2, 1024), (1, 2048)),
            gqa_kv_heads=(4, 1), gqa_shape=(1, 1024) if quick else (2, 1024), decode_context=256 if quick else 512,
            decode_steps=16, rounds=3 if quick else 7, min_block_s=0.05 if quick else 0.2,
            corpus_items=48 if quick else None, capture_rounds=2 if quick else 5, hf_batch_size=32,
            analysis_items=32 if quick else None, analysis_rounds=1 if quick else 5,
            importance_pairs=16 if quick else None, matmul_size=1024 if quick else 2048, copy_mib=64 if quick else 256,
            causal_shape=(2, 512) if quick else (4, 512),
            circuit_tokens=128, circuit_edges=200 if quick else 400, memory_rounds=1 if quick else 3,
            large_model=(4, 512) if quick else (16, 2048), large_shape=(1, 128) if quick else (1, 512),
            long_context_lengths=(256, 512, 1024) if quick else (4096, 16384, 32768),
            long_context_pattern_memory=2**22 if quick else 2**27, long_context_rounds=1 if quick else 2,
        )
    if device == "cuda":
        return Plan(
            device="cuda", dtype="bfloat16", d_model=768, n_heads=12,
            layer_shapes=((64, 128), (2, 4096)) if quick else ((64, 128), (8, 1024), (4, 2048), (2, 4096)),
            gqa_kv_heads=(4, 1), gqa_shape=(2, 4096), decode_context=2048, decode_steps=32,
            rounds=5 if quick else 15, min_block_s=0.05 if quick else 0.2,
            corpus_items=None, capture_rounds=3 if quick else 7, hf_batch_size=32,
            analysis_items=None, analysis_rounds=2 if quick else 3,
            importance_pairs=None, matmul_size=8192, copy_mib=1024,
            ceiling_goal_positions=4096, ceiling_goal=0.5, causal_shape=(8, 2048),
            circuit_tokens=128, circuit_edges=200 if quick else 1000, memory_rounds=2 if quick else 3,
            large_model=(4, 512) if quick else (16, 2048), large_shape=(1, 512) if quick else (4, 2048),
            long_context_lengths=(1024, 2048, 4096) if quick else (4096, 16384, 32768),
            long_context_pattern_memory=2**26 if quick else 2**29, long_context_rounds=2 if quick else 3,
        )
    raise ValueError(f"device={device!r}; expected 'cpu' or 'cuda'")
