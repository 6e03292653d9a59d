"""Layer benchmark: headlab vs nn.MultiheadAttention vs the raw floor, measured in one run.

    python benchmarks/bench_layer.py [--quick] [--json] [--out benchmarks/RESULTS.md]

The raw floor is the least work any implementation can do: one fused F.linear for q, k, v,
scaled_dot_product_attention, and the output F.linear. Every number is a ratio against a
peer timed in the same run, in interleaved rounds (each round times every contender once;
the median round counts), so that drift of a shared machine hits all contenders alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import headlab

sys.path.insert(0, str(Path(__file__).parent))
from results import RESULTS, write_section  # noqa: E402  (a script beside this one, not a package)

SHAPES = [(8, 256, 512, 8), (1, 1024, 768, 12)]  # (batch, pos, d_model, n_heads)
DECODE_CONTEXT = 512


@dataclass
class Row:
    """One comparison: headlab (or, in A/A rows, the floor) against a peer timed in the same run."""

    shape: str
    measure: str
    headlab_s: float
    peer: str
    peer_s: float
    goal: float | None  # headlab / peer must be <= goal

    @property
    def ratio(self) -> float:
        return self.headlab_s / self.peer_s

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.ratio <= self.goal


def time_interleaved(fns: dict[str, Callable[[], object]], *, rounds: int, min_block_s: float) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds."""
    numbers = {}
    for name, fn in fns.items():  # warm up, then size each block to about min_block_s
        for _ in range(3):
            fn()
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < min_block_s / 2:
            fn()
            n += 1
        numbers[name] = max(1, int(n * min_block_s / (time.perf_counter() - start)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(numbers[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / numbers[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def raw_floor(mha: nn.MultiheadAttention) -> Callable[[Tensor], Tensor]:
    """One fused F.linear + scaled_dot_product_attention + F.linear, with mha's weights."""
    w_in, b_in, w_out, b_out = mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias
    n_heads = mha.num_heads

    def forward(x: Tensor) -> Tensor:
        batch, pos, d_model = x.shape
        q, k, v = F.linear(x, w_in, b_in).view(batch, pos, 3, n_heads, d_model // n_heads).unbind(2)
        z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return F.linear(z.transpose(1, 2).reshape(batch, pos, d_model), w_out, b_out)

    return forward


def bench_shape(batch: int, pos: int, d_model: int, n_heads: int, *, rounds: int, block: float) -> list[Row]:
    shape = f"batch {batch} · pos {pos} · d_model {d_model} · {n_heads} heads"
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    layer = headlab.from_torch(mha)
    floor = raw_floor(mha)
    x = torch.randn(batch, pos, d_model)
    rows = []

    mha.eval(), layer.eval()
    with torch.no_grad():
        t = time_interleaved({
            "headlab": lambda: layer(x),
            "floor": lambda: floor(x),
            "floor_again": lambda: floor(x),
            "mha": lambda: mha(x, x, x, need_weights=False),
            "mha_weights": lambda: mha(x, x, x),
            "headlab_one_pattern": lambda: layer(x, return_patterns=[0]),
            "headlab_all_patterns": lambda: layer(x, return_patterns=True),
            "mha_unaveraged": lambda: mha(x, x, x, average_attn_weights=False),
        }, rounds=rounds, min_block_s=block)
    rows += [
        Row(shape, "A/A: the floor against itself (timing noise)", t["floor_again"], "raw floor", t["floor"], None),
        Row(shape, "forward", t["headlab"], "raw floor", t["floor"], 1.05),
        Row(shape, "forward", t["headlab"], "nn.MHA need_weights=False", t["mha"], 0.85),
        Row(shape, "forward", t["headlab"], "nn.MHA need_weights=True", t["mha_weights"], None),
        Row(shape, "forward + one head's pattern", t["headlab_one_pattern"], "headlab forward", t["headlab"], 1.15),
        Row(shape, "forward + one head's pattern", t["headlab_one_pattern"], "nn.MHA need_weights=True",
            t["mha_weights"], None),
        Row(shape, "forward + every head's pattern", t["headlab_all_patterns"], "nn.MHA unaveraged weights",
            t["mha_unaveraged"], None),
    ]

    mha.train(), layer.train()  # dropout is 0: train mode only turns off torch's inference fast path
    grad = torch.randn(batch, pos, d_model)
    t = time_interleaved({
        "headlab": lambda: layer(x).backward(grad),
        "floor": lambda: floor(x).backward(grad),
        "mha": lambda: mha(x, x, x, need_weights=False)[0].backward(grad),
    }, rounds=rounds, min_block_s=block)
    rows += [
        Row(shape, "forward + backward", t["headlab"], "raw floor", t["floor"], None),
        Row(shape, "forward + backward", t["headlab"], "nn.MHA need_weights=False", t["mha"], 0.9),
    ]
    return rows


def bench_decode(d_model: int, n_heads: int, *, rounds: int, block: float) -> list[Row]:
    """One decoding step after DECODE_CONTEXT cached positions: headlab's cache vs a raw cache."""
    shape = f"decode 1 token · {DECODE_CONTEXT} cached · d_model {d_model} · {n_heads} heads"
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    layer = headlab.from_torch(mha).eval()
    d_head = d_model // n_heads
    prompt, step = torch.randn(1, DECODE_CONTEXT, d_model), torch.randn(1, 1, d_model)
    with torch.no_grad():
        cache = layer.new_kv_cache(batch_size=1, max_len=DECODE_CONTEXT + 1)
        layer(prompt, kv_cache=cache, is_causal=True)
        raw_k = torch.zeros(1, n_heads, DECODE_CONTEXT + 1, d_head)
        raw_v = torch.zeros_like(raw_k)
        raw_k[:, :, :DECODE_CONTEXT], raw_v[:, :, :DECODE_CONTEXT] = cache.keys[:, :, :DECODE_CONTEXT], cache.values[
            :, :, :DECODE_CONTEXT]

        def headlab_step() -> Tensor:
            cache.length = DECODE_CONTEXT  # rewind: every call decodes the same position
            return layer(step, kv_cache=cache, is_causal=True)

        def raw_step() -> Tensor:
            q, k, v = F.linear(step, mha.in_proj_weight, mha.in_proj_bias).view(1, 1, 3, n_heads, d_head).unbind(2)
            raw_k[:, :, DECODE_CONTEXT] = k[:, 0]
            raw_v[:, :, DECODE_CONTEXT] = v[:, 0]
            z = F.scaled_dot_product_attention(q.transpose(1, 2), raw_k, raw_v)
            return F.linear(z.transpose(1, 2).reshape(1, 1, d_model), mha.out_proj.weight, mha.out_proj.bias)

        torch.testing.assert_close(headlab_step(), raw_step())
        t = time_interleaved({"headlab": headlab_step, "raw": raw_step}, rounds=rounds, min_block_s=block)
    return [Row(shape, "decoding step", t["headlab"], "raw floor with a preallocated cache", t["raw"], None)]


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "torch threads": str(torch.get_num_threads()),
        "logical cpus": str(torch.multiprocessing.cpu_count()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "headlab": headlab.__version__,
        "date (UTC)": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }


def to_markdown(rows: list[Row], info: dict[str, str], command: str) -> str:
    lines = [
        "## Layer",
        "",
        "By `benchmarks/bench_layer.py`. float32, CPU. Ratio = headlab / peer,",
        "both measured in the same run (interleaved rounds, median). Goal: ratio must be at most the number given.",
        "The A/A rows time the same function as two contenders: their distance from 1.000 is this run's noise.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()),
        "",
        f"Command: `{command}`",
        "",
        "| shape | measure | headlab ms | peer | peer ms | ratio | goal | met |",
        "|---|---|---:|---|---:|---:|---:|:---:|",
    ]
    for r in rows:
        goal = "" if r.goal is None else f"≤ {r.goal:.2f}"
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.shape} | {r.measure} | {r.headlab_s * 1e3:.3f} | {r.peer} | {r.peer_s * 1e3:.3f} "
                     f"| {r.ratio:.3f} | {goal} | {met} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file; only its layer section is replaced")
    args = parser.parse_args(argv)
    rounds, block = (3, 0.05) if args.quick else (15, 0.3)
    rows: list[Row] = []
    for batch, pos, d_model, n_heads in SHAPES:
        rows += bench_shape(batch, pos, d_model, n_heads, rounds=rounds, block=block)
    rows += bench_decode(768, 12, rounds=rounds, block=block)
    info = machine()
    markdown = to_markdown(rows, info, "python " + " ".join(sys.argv))
    write_section("layer", markdown, args.out)
    if args.json:
        print(json.dumps({"machine": info, "rows": [asdict(r) | {"ratio": r.ratio, "met": r.met} for r in rows]},
                         indent=2))
    else:
        print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
