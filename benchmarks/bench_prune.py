"""Pruning benchmark: MiniLM with half of every layer's heads removed vs the full model, same run.

    python benchmarks/bench_prune.py [--quick]

Contenders, on the same batches of the bundled corpus (sorted by length, batch 32):
plain transformers (its sdpa path), headlab's swapped model, the same with half the heads
masked (no saving: masked heads are still computed), and with the same heads pruned.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import headlab
from headlab import heads
from headlab.data import corpus_lines

sys.path.insert(0, str(Path(__file__).parent))
from bench_layer import machine, time_interleaved  # noqa: E402  (scripts beside this one)
from results import write_section  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, block = (3, 0.2) if args.quick else (9, 1.0)

    from transformers import AutoModel

    loaded = headlab.load()
    plain = AutoModel.from_pretrained(loaded.source, attn_implementation="sdpa", use_safetensors=True).eval()
    n_layers = len(headlab.models.attention_layers(loaded.model))
    n_heads = headlab.models.attention_layers(loaded.model)[0].config.n_heads
    half = {layer: list(range(0, n_heads, 2)) for layer in range(n_layers)}  # every other head
    masked, pruned = copy.deepcopy(loaded.model), copy.deepcopy(loaded.model)
    heads.mask(masked, half)
    heads.prune(pruned, half)

    lines = sorted(corpus_lines(), key=len)[:: 2 if args.quick else 1]
    batches = [loaded.tokenizer(lines[i : i + 32], padding=True, truncation=True, max_length=256, return_tensors="pt")
               for i in range(0, len(lines), 32)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    with torch.no_grad():
        full_out = [loaded.model(**b).last_hidden_state for b in batches]
        for b, want in zip(batches, full_out):  # masked and pruned agree; pruning changes outputs vs full
            torch.testing.assert_close(pruned(**b).last_hidden_state, masked(**b).last_hidden_state,
                                       atol=1e-4, rtol=1e-4)

        def run(model):
            return lambda: [model(**b) for b in batches]

        t = time_interleaved({"plain": run(plain), "swapped": run(loaded.model), "masked": run(masked),
                              "pruned": run(pruned)}, rounds=rounds, min_block_s=block)
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in
              (("swapped", loaded.model), ("pruned", pruned))}
    info = machine()
    lines_md = [
        "## Pruning",
        "",
        f"By `benchmarks/bench_prune.py`{' --quick' if args.quick else ''}: all-MiniLM-L6-v2, {n_layers} layers × "
        f"{n_heads} heads, every other head of every layer pruned ({n_layers * n_heads // 2} of "
        f"{n_layers * n_heads}); the bundled corpus ({len(lines)} items, {tokens} tokens) in length-sorted "
        f"batches of 32; float32 CPU; interleaved rounds, median. Pruned outputs equal masked outputs "
        "(checked in the run).",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "| model | seconds per pass | tokens/s | vs headlab full | vs plain transformers |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("plain", "plain transformers (sdpa)"), ("swapped", "headlab, all heads"),
                        ("masked", "headlab, half the heads masked"), ("pruned", "headlab, half the heads pruned")):
        lines_md.append(f"| {label} | {t[name]:.3f} | {tokens / t[name]:,.0f} | {t[name] / t['swapped']:.3f} "
                        f"| {t[name] / t['plain']:.3f} |")
    lines_md += ["", f"Parameters: {params['swapped']:,} full, {params['pruned']:,} pruned "
                     f"({params['swapped'] - params['pruned']:,} fewer)."]
    markdown = "\n".join(lines_md)
    write_section("prune", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
