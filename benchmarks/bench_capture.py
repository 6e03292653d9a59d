"""Capture benchmark: every head's pattern of MiniLM over the bundled corpus vs the plain HF forward.

    python benchmarks/bench_capture.py [--quick] [--json] [--batch-size 32] [--out benchmarks/RESULTS.md]

Contenders, each one full pass over the corpus (tokenization included), timed in interleaved
rounds with bench_layer.py's ``time_interleaved`` (median round):

- the peer: transformers' own MiniLM, not swapped, ``attn_implementation="sdpa"``, batches of
  ``--batch-size`` items in corpus order, each padded to its longest item;
- ``headlab.capture.capture`` of all 6 × 12 heads' patterns into a no-op consumer, length-
  bucketed batches of the same size (and, separately, its default token budget);
- for reading the gap: the peer with the capture's bucketed batches, the swapped model's forward
  without taps, transformers' eager attention returning every pattern (``output_attentions``),
  and an A/A row (the peer against itself: this run's noise).

The table goes to stdout and into RESULTS.md's ``capture`` section (``results.write_section``;
the other sections are kept). ``--quick`` runs the first 120 items and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layer import machine, time_interleaved  # noqa: E402  (scripts beside this one)
from results import RESULTS, write_section  # noqa: E402

import headlab.models  # noqa: E402
from headlab.capture import (  # noqa: E402
    capture, collate, load_corpus, naive_batches, padding_stats, plan_batches, tokenize_corpus,
)

MAX_LENGTH = 512


@dataclass
class Row:
    contender: str
    batching: str
    batches: int
    padding: float  # padded tokens / real tokens
    seconds: float  # one pass over the corpus
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


class NoOp:
    def update(self, batch: object) -> None:
        pass


def bench(texts: list[str], *, batch_size: int, rounds: int, device: str) -> list[Row]:
    from transformers import AutoModel

    loaded = headlab.models.load(device=device)
    tokenizer, path = loaded.tokenizer, headlab.models.default_model_path()
    sdpa = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval().to(device)
    eager = AutoModel.from_pretrained(path, attn_implementation="eager").eval().to(device)

    lengths = tokenize_corpus(tokenizer, texts, max_length=MAX_LENGTH).lengths
    naive = naive_batches(len(texts), batch_size=batch_size)
    bucketed = plan_batches(lengths, batch_tokens=None, max_batch_size=batch_size)
    default = plan_batches(lengths)  # capture's defaults: batch_tokens=4096, max_batch_size=64

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def hf_pass(model: torch.nn.Module, batches: list[list[int]], **kwargs: object) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                for indices in batches:
                    inputs = tokenizer([texts[i] for i in indices], padding="longest", truncation=True,
                                       max_length=MAX_LENGTH, return_tensors="pt").to(device)
                    model(**inputs, **kwargs)
            sync()
        return run

    def swapped_pass() -> None:
        tokenized = tokenize_corpus(tokenizer, texts, max_length=MAX_LENGTH)
        with torch.inference_mode():
            for indices in bucketed:
                batch = collate(tokenized, indices, device=device)
                loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        sync()

    def capture_pass(**kwargs: object) -> Callable[[], None]:
        def run() -> None:
            capture(loaded, corpus=texts, consumers=[NoOp()], max_length=MAX_LENGTH, progress=False, **kwargs)
            sync()
        return run

    # The HF tokenizer pads each naive batch to its own longest item, as collate does.
    probe = tokenizer([texts[i] for i in naive[0]], padding="longest", truncation=True, max_length=MAX_LENGTH)
    assert len(probe["input_ids"][0]) == max(lengths[i] for i in naive[0]), "HF tokenizer padded beyond the batch"

    fns = {
        "hf_naive": hf_pass(sdpa, naive),
        "hf_naive_again": hf_pass(sdpa, naive),
        "capture_same_size": capture_pass(batch_tokens=None, max_batch_size=batch_size),
        "capture_default": capture_pass(),
        "hf_bucketed": hf_pass(sdpa, bucketed),
        "swapped_bucketed": swapped_pass,
        "hf_eager_attentions": hf_pass(eager, naive, output_attentions=True),
    }
    t = time_interleaved(fns, rounds=rounds, min_block_s=1e-3)  # one pass per contender per round
    n = sum(lengths)
    pad = {name: padding_stats(lengths, b).ratio for name, b in (("naive", naive), ("bucketed", bucketed),
                                                                  ("default", default))}
    same = f"bucketed, ≤ {batch_size} items"
    naive_desc = f"corpus order, {batch_size} items"
    return [
        Row("HF MiniLM, sdpa (the peer)", naive_desc, len(naive), pad["naive"], t["hf_naive"], n),
        Row("A/A: the peer again (noise)", naive_desc, len(naive), pad["naive"], t["hf_naive_again"], n),
        Row("**capture, all 72 heads' patterns**", same, len(bucketed), pad["bucketed"], t["capture_same_size"], n),
        Row("capture, all 72 heads' patterns", "bucketed, defaults (4096 tokens, ≤ 64 items)", len(default),
            pad["default"], t["capture_default"], n),
        Row("HF MiniLM, sdpa", same, len(bucketed), pad["bucketed"], t["hf_bucketed"], n),
        Row("headlab-swapped MiniLM, no tap", same, len(bucketed), pad["bucketed"], t["swapped_bucketed"], n),
        Row("HF MiniLM, eager, output_attentions=True", naive_desc, len(naive), pad["naive"],
            t["hf_eager_attentions"], n),
    ]


def to_markdown(rows: list[Row], info: dict[str, str], command: str, n_items: int, device: str) -> str:
    peer = rows[0].seconds
    lines = [
        "## Capture",
        "",
        "By `benchmarks/bench_capture.py`. MiniLM (6 layers × 12 heads), float32, "
        f"{device}, the bundled corpus ({n_items} items, {rows[0].tokens} tokens). One pass over the corpus, "
        "tokenization included, timed in interleaved rounds (median). Padding = padded / real tokens. "
        "Speed-up = the peer's time / the contender's.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()),
        "",
        f"Command: `{command}`",
        "",
        "| contender | batching | batches | padding | s / pass | tokens/s | speed-up vs peer |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.contender} | {r.batching} | {r.batches} | {r.padding:.2f} | {r.seconds:.3f} "
                     f"| {r.tokens_per_second:,.0f} | {peer / r.seconds:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 120 items, 3 rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (3 with --quick)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file; only its capture section is replaced")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = list(load_corpus().texts)
    texts = texts[:120] if args.quick else texts
    rounds = args.rounds or (3 if args.quick else 7)
    rows = bench(texts, batch_size=args.batch_size, rounds=rounds, device=args.device)
    info = machine()
    if args.device.startswith("cuda"):
        info = {"gpu": torch.cuda.get_device_name(), **info}
    section = to_markdown(rows, info, "python " + " ".join(sys.argv), len(texts), args.device)
    if not args.quick:
        write_section("capture", section, args.out)
    if args.json:
        print(json.dumps({"machine": info, "rows": [asdict(r) | {"tokens_per_second": r.tokens_per_second}
                                                    for r in rows]}, indent=2))
    else:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
