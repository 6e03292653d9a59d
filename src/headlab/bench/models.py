"""Real models: headlab's attention attached to transformers models, against transformers' own.

Axis legend: input_ids ``(batch, pos)``; patterns ``(batch, head, query_pos, key_pos)``.

Each model's contenders are timed in one interleaved group; every ratio is of two of them:

- attached, nothing inspected / the plain model (``attn_implementation="sdpa"``): what going
  through headlab's function costs when nobody looks (goal ``ATTACHED_GOAL``);
- attached with ``output_attentions=True`` / transformers' eager model with
  ``output_attentions=True``: every head's pattern (goal ``EVERY_PATTERN_GOAL``);
- attached with one head's pattern tapped / the plain model (goal ``ONE_HEAD_GOAL``), for
  head 0 of layer 0 and for head 0 of every layer, the pattern handed to a sink that keeps
  nothing.

Models: the loaded default model (MiniLM: bidirectional, padded batches of the bundled corpus,
items sorted by length, tokenized before timing); ``tiny_causal_model``, a random Llama
built from a config with a fixed seed (causal, grouped-query, rotary; random token ids at
``plan.causal_shape``, no padding); and ``random_model``'s ViT (as many 224 × 224 random images as
``plan.causal_shape``'s batch) and BART (its batch, a source of half its positions and a target of a
quarter: encoder self-attention, decoder causal self-attention and cross-attention). The peers are the
same model object switched to transformers' ``"sdpa"`` or ``"eager"`` implementation for their turn
(``running``): the same
weights in the same memory, since two copies of one model can differ by several percent in
speed from where their weights were allocated. Each contender's outputs (and patterns) are
checked equal to its peer's before timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from headlab.bench.layer import check_same
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved

__all__ = ["ATTACHED_GOAL", "EVERY_PATTERN_GOAL", "ONE_HEAD_GOAL", "SEQ2SEQ_CONFIG", "VISION_CONFIG", "bench_models",
           "check_models", "random_model", "running", "tiny_causal_model"]

ATTACHED_GOAL = 1.02  # attached, nothing inspected / plain model (sdpa)
EVERY_PATTERN_GOAL = 1.00  # attached, output_attentions=True / eager model, output_attentions=True
ONE_HEAD_GOAL = 1.15  # attached, one head's pattern tapped / plain model (sdpa)

# The tiny causal model: 8 query heads sharing 2 key/value heads (grouped-query), d_head 32.
CAUSAL_CONFIG = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                 "intermediate_size": 688, "vocab_size": 1024}

# The vision and encoder-decoder cases: a random ViT on 224 × 224 images (16-pixel patches: 196 + [CLS]) and a
# random BART (encoder and decoder of 4 layers, cross-attention in each decoder layer).
VISION_CONFIG = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 1536,
                 "image_size": 224, "patch_size": 16}
SEQ2SEQ_CONFIG = {"d_model": 256, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 8,
                  "decoder_attention_heads": 8, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024, "vocab_size": 1024,
                  "max_position_embeddings": 512}

Batch = dict[str, Tensor]  # keyword arguments of one forward


def tiny_causal_model(*, positions: int, device: str = "cpu", dtype: torch.dtype = torch.float32,
                      seed: int = 0) -> nn.Module:
    """A random ``LlamaModel`` of ``CAUSAL_CONFIG``, built without a download, in eval mode (sdpa).

    Args:
        positions: the longest input it will see (its rotary table's length).
        device, dtype: where and in what it runs.
        seed: the weights' seed.

    Returns:
        The base model (no language-model head: its vocabulary projection would dilute every ratio).
    """
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(**CAUSAL_CONFIG, max_position_embeddings=positions, use_cache=False,
                         attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaModel(config).to(device=device, dtype=dtype).eval()


@contextmanager
def running(model: nn.Module, implementation: str) -> Iterator[nn.Module]:
    """``model`` with transformers' own ``implementation`` ("sdpa", "eager") while the block lasts;
    headlab's attention is selected again afterwards (its sites stay in place, unused meanwhile)."""
    from headlab.models.interface import IMPLEMENTATION

    transformers_model: Any = model
    transformers_model.set_attn_implementation(implementation)
    try:
        yield model
    finally:
        transformers_model.set_attn_implementation(IMPLEMENTATION)


def bench_models(plan: Plan, loaded: Any, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """headlab's attention in the default model and in a tiny causal model, against transformers' own.

    Args:
        plan: device, dtype, corpus slice, batch size, rounds and ``causal_shape``.
        loaded: ``headlab.load()``'s result on the plan's device and dtype.
        tick: progress.

    Returns:
        The "models" area: per model an A/A row and one row per goal.

    Raises:
        RuntimeError: a contender's outputs or patterns differ from its peer's.
    """
    import headlab
    from headlab.bench.capture import model_name
    from headlab.capture import load_corpus

    area = Area("models", "Models: headlab's attention in transformers models vs transformers' own", (
        f"{plan.dtype} on {plan.device}, inference. Per model, every contender in one interleaved group "
        f"({plan.rounds} rounds, median); one call = one pass over the model's batches, tokenized before timing. "
        "Peers are the same model object switched to transformers' own attention (sdpa, eager) for their turn: the "
        "same weights in the same memory. Each contender's outputs, patterns included, are checked equal to its "
        "peer's before timing. One head's pattern: a tap on "
        "head 0 of layer 0, and on head 0 of every layer, into a sink that keeps nothing. The tiny Llama has random "
        "weights (seed 0) and runs random token ids without padding. The A/A row times the plain model against "
        "itself: its distance from 1.00 is this run's noise."))

    texts = sorted(list(load_corpus().texts)[: plan.corpus_items], key=len)
    tokenizer, size = loaded.tokenizer, plan.hf_batch_size
    max_length = loaded.max_length
    batches = [dict(tokenizer(texts[i: i + size], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt").to(plan.device)) for i in range(0, len(texts), size)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    tick(f"models: {len(texts)} items")
    area.rows += _compare(plan, loaded.model, batches, area, min_block_s=1e-6, tokens=tokens, case=(
        f"{model_name(loaded)} · {len(texts)} items · {tokens} tokens · batches of {size}"))

    batch, pos = plan.causal_shape
    attached = headlab.attach(tiny_causal_model(positions=pos, device=plan.device, dtype=plan.torch_dtype)).model
    c = CAUSAL_CONFIG
    ids = torch.randint(0, c["vocab_size"], (batch, pos), generator=torch.Generator().manual_seed(0)).to(plan.device)
    case = (f"tiny random Llama, {c['num_hidden_layers']} layers × {c['num_attention_heads']} heads "
            f"({c['num_key_value_heads']} kv heads), d_model {c['hidden_size']}, causal · batch {batch} · pos {pos}")
    tick(f"models: {case}")
    area.rows += _compare(plan, attached, [{"input_ids": ids}], area, min_block_s=plan.min_block_s,
                          tokens=batch * pos, case=case)

    generator = torch.Generator().manual_seed(0)
    images = batch
    vision = headlab.attach(random_model("vision", device=plan.device, dtype=plan.torch_dtype)).model
    pixels = torch.randn(images, 3, 224, 224, generator=generator).to(device=plan.device, dtype=plan.torch_dtype)
    v = VISION_CONFIG
    case = (f"random ViT, {v['num_hidden_layers']} layers × {v['num_attention_heads']} heads, d_model "
            f"{v['hidden_size']} · {images} images of 224 × 224 (197 positions)")
    tick(f"models: {case}")
    area.rows += _compare(plan, vision, [{"pixel_values": pixels}], area, min_block_s=plan.min_block_s,
                          tokens=images * 197, case=case)

    seq2seq = headlab.attach(random_model("seq2seq", device=plan.device, dtype=plan.torch_dtype)).model
    e = SEQ2SEQ_CONFIG
    source = torch.randint(3, e["vocab_size"], (batch, pos // 2), generator=generator).to(plan.device)
    target = torch.randint(3, e["vocab_size"], (batch, pos // 4), generator=generator).to(plan.device)
    case = (f"random BART, {e['encoder_layers']} + {e['decoder_layers']} layers × {e['encoder_attention_heads']} heads "
            f"(self and cross), d_model {e['d_model']} · batch {batch} · source {pos // 2}, target {pos // 4}")
    tick(f"models: {case}")
    area.rows += _compare(plan, seq2seq, [{"input_ids": source, "decoder_input_ids": target}], area,
                          min_block_s=plan.min_block_s, tokens=batch * (pos // 2 + pos // 4), case=case)
    return area


def random_model(kind: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """A random ``ViTModel`` of ``VISION_CONFIG`` ("vision") or ``BartModel`` of ``SEQ2SEQ_CONFIG`` ("seq2seq"),
    built without a download, in eval mode (sdpa)."""
    from transformers import BartConfig, BartModel, ViTConfig, ViTModel

    torch.manual_seed(seed)
    if kind == "vision":
        model: nn.Module = ViTModel(ViTConfig(**VISION_CONFIG, attn_implementation="sdpa"))
    elif kind == "seq2seq":
        model = BartModel(BartConfig(**SEQ2SEQ_CONFIG, use_cache=False, attn_implementation="sdpa"))
    else:
        raise ValueError(f"kind={kind!r}; expected 'vision' or 'seq2seq'")
    return model.to(device=device, dtype=dtype).eval()


def _patterns(output: Any, sites: list[Any]) -> list[Tensor]:
    """Every site's pattern from a transformers output with ``output_attentions=True``, in site order: its
    ``attentions``, or an encoder-decoder's encoder, decoder and cross attentions interleaved as they ran."""
    if getattr(output, "attentions", None) is not None:
        return list(output.attentions)
    encoder, decoder, cross = (iter(getattr(output, name)) for name in ("encoder_attentions", "decoder_attentions",
                                                                          "cross_attentions"))
    return [next(cross) if site.cross else next(decoder) if site.causal else next(encoder) for site in sites]


def _compare(plan: Plan, attached: nn.Module, batches: list[Batch], area: Area, *, min_block_s: float, tokens: int,
             case: str) -> list[Comparison]:
    """Check and time one attached model against itself under transformers' sdpa and eager
    implementations; one call = one pass over ``batches``."""
    from headlab.capture.taps import tapped
    from headlab.models import headed

    sites = headed(attached).sites
    every_layer = {site.layer: [0] for site in sites}

    def discard(layer: int, taken: object) -> None:
        pass

    def run(implementation: str | None, *, taps: dict[int, list[int]] | None = None,
            **kwargs: object) -> Callable[[], None]:
        def once() -> None:
            with nullcontext() if implementation is None else running(attached, implementation), \
                    nullcontext() if taps is None else tapped(sites, taps, ("pattern",), discard):
                for b in batches:
                    attached(**b, **kwargs)
        return once

    with torch.inference_mode():
        for b in batches:  # also the warm-up of every contender
            check_models(case, attached, b, dtype=plan.torch_dtype)
        t = time_interleaved({
            "plain": run("sdpa"), "plain again": run("sdpa"), "attached": run(None),
            "attached attentions": run(None, output_attentions=True),
            "eager attentions": run("eager", output_attentions=True),
            "one head": run(None, taps={sites[0].layer: [0]}),
            "one head every layer": run(None, taps=every_layer),
        }, rounds=plan.rounds, min_block_s=min_block_s, warmup=0, device=plan.device)
    sdpa = "plain transformers (sdpa)"
    rows = [
        Comparison(case, "A/A: plain transformers (timing noise)", sdpa, t["plain again"], t["plain"], tokens=tokens),
        Comparison(case, "headlab attached, nothing inspected", sdpa, t["attached"], t["plain"], goal=ATTACHED_GOAL,
                   tokens=tokens),
        Comparison(case, "headlab attached, output_attentions=True", "transformers eager, output_attentions=True",
                   t["attached attentions"], t["eager attentions"], goal=EVERY_PATTERN_GOAL, tokens=tokens),
        Comparison(case, f"headlab attached, one head's pattern (layer {sites[0].layer}, head 0)", sdpa,
                   t["one head"], t["plain"], goal=ONE_HEAD_GOAL, tokens=tokens),
        Comparison(case, f"headlab attached, one head's pattern in every layer (head 0 of {len(sites)})", sdpa,
                   t["one head every layer"], t["plain"], goal=ONE_HEAD_GOAL, tokens=tokens),
    ]
    _note_misses(area, case, rows)
    return rows


def check_models(case: str, attached: nn.Module, batch: Batch, *, dtype: torch.dtype) -> None:
    """Every contender computes what its peer computes on ``batch`` (else their timings do not compare).

    Like with like, as the rows divide them: the attached model with nothing inspected and
    with head 0 of every layer tapped against the plain (sdpa) model; the attached model with
    ``output_attentions=True`` against the eager model (last hidden state and every pattern);
    the tapped patterns against the eager model's head 0. (sdpa and eager differ by rounding,
    beyond tolerance in bfloat16, so they are not compared with each other.)

    Args:
        case: named in the error.
        attached: a model with headlab's attention attached; its peers are itself under
            transformers' "sdpa" and "eager" attention (``running``).
        batch: keyword arguments of one forward.
        dtype: the models' dtype (sets the tolerance).

    Raises:
        RuntimeError: two of them disagree; the message names which.
    """
    from headlab.capture.taps import tapped
    from headlab.models import headed

    sites = headed(attached).sites
    taken: dict[int, Tensor] = {}

    def keep(layer: int, output: Any) -> None:
        taken[layer] = output.pattern

    with tapped(sites, {site.layer: [0] for site in sites}, ("pattern",), keep):
        one_head = attached(**batch).last_hidden_state
    with running(attached, "sdpa"):
        plain = attached(**batch).last_hidden_state
    with running(attached, "eager"):
        theirs = attached(**batch, output_attentions=True)
    check_same(case, {"plain transformers (sdpa)": plain,
                      "headlab attached": attached(**batch).last_hidden_state,
                      "headlab attached, head 0 tapped in every layer": one_head}, dtype)
    ours = attached(**batch, output_attentions=True)
    check_same(case, {"transformers eager, output_attentions=True": theirs.last_hidden_state,
                      "headlab attached, output_attentions=True": ours.last_hidden_state}, dtype)
    their_patterns, our_patterns = _patterns(theirs, sites), _patterns(ours, sites)
    for site, a, b in zip(sites, their_patterns, our_patterns, strict=True):
        check_same(f"{case}, layer {site.layer}'s patterns", {"transformers eager": a, "headlab attached": b}, dtype)
    check_same(f"{case}, head 0's pattern", {
        "transformers eager": torch.cat([their_patterns[site.layer][:, :1].flatten() for site in sites]),
        "headlab's tap": torch.cat([taken[site.layer].flatten() for site in sites])}, dtype)


def _note_misses(area: Area, case: str, rows: list[Comparison]) -> None:
    """Set each missed goal beside the A/A row of the same group (the first row), so noise is not read as a cost."""
    noise = rows[0].ratio
    for row in rows[1:]:
        if row.met() is False:
            area.notes.append(f"{case}: {row.contender} vs {row.peer} took {row.ratio:.3f}× (goal ≤ "
                              f"{row.goal:.2f}); the A/A row of the same group measured {noise:.3f}×.")
