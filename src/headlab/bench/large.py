"""Large models: a random Llama of 1B-class shapes, saved on the fly, loaded, run and pruned by headlab.

Axis legend: input_ids ``(batch, pos)``; patterns ``(batch, head, query_pos, key_pos)``.

The model needs no download: ``large_config`` gives a Llama of ``plan.large_model``'s layers and width with
a real 1B model's proportions (heads of ``D_HEAD``, ``QUERIES_PER_KV`` query heads per key/value head, an
intermediate size of ``FFN_FACTOR`` × d_model; a vocabulary of ``VOCAB``), the full run's 16 × 2048 being
Llama 3.2 1B's shapes. ``build_large_model`` makes it with its parameters on the meta device, gives them
memory (``to_empty``) and fills each from its own seeded generator (normal, std ``INIT_STD``; the norms'
weights 1): meaningless weights, finite and not degenerate, made in seconds. It runs in float32 or
bfloat16, whichever runs its forward faster here (``choose_dtype``: one forward of each, interleaved), is
saved with ``save_pretrained`` into a temporary folder, and a copy with half its heads pruned is saved by
``headlab.heads.save`` beside it; none of that is timed.

Rows, each against its peer measured in the same interleaved group:

- ``headlab.load`` of the folder / transformers' ``AutoModelForCausalLM.from_pretrained`` of it (goal
  ``LOAD_GOAL``); transformers maps the safetensors file and reads a weight when it is first used, while
  headlab's attach runs its probe forward, which reads every weight, so the same two loads followed by one
  short forward each are timed too (both then read every weight), and, as the bound of what attach does
  beyond loading, headlab's load and forward against transformers' load, a forward of the probe's inputs and
  the same forward; the peak memory of the loads, alone and followed by the short forward;
- the pruned checkpoint's load / the unpruned one's, both ``headlab.load`` (goal ``PRUNED_LOAD_GOAL``), and
  their peak memory (goal ``PRUNED_MEMORY_GOAL``);
- the attached model's decoder stack with nothing inspected, and with head 0 of every layer tapped into a
  sink that keeps nothing / the same model object switched to transformers' sdpa (``running``; goals
  ``ATTACHED_GOAL`` and ``ONE_HEAD_GOAL`` of ``headlab.bench.models``), and their peak memory.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headlab.bench.layer import check_same
from headlab.bench.memory import peak_memory_available, peak_memory_interleaved
from headlab.bench.models import ATTACHED_GOAL, ONE_HEAD_GOAL, running
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import Timing, time_interleaved

__all__ = ["CANDIDATE_DTYPES", "LOAD_GOAL", "PRUNED_LOAD_GOAL", "PRUNED_MEMORY_GOAL", "bench_large",
           "build_large_model", "choose_dtype", "half_the_groups", "large_config", "save_large_model"]

LOAD_GOAL = 1.05  # headlab.load / transformers' from_pretrained, same folder and dtype
PRUNED_LOAD_GOAL = 1.2  # headlab.load of the half-pruned checkpoint / of the unpruned one
PRUNED_MEMORY_GOAL = 1.0  # peak memory of those two loads

D_HEAD = 64  # Llama 3.2 1B: 32 query heads of 64 over d_model 2048 …
QUERIES_PER_KV = 4  # … sharing 8 key/value heads …
FFN_FACTOR = 4  # … an MLP of 8192 …
VOCAB = 8192  # … and a vocabulary cut from 128,256 (its projection would dominate a small model's time)
INIT_STD = 0.02  # transformers' initializer_range for Llama
SHORT_INPUT = 16  # tokens of the forward that follows each load in the "load + one forward" pair
CANDIDATE_DTYPES = ("float32", "bfloat16")
LAZY_LOAD_NOTE = ("headlab.load vs from_pretrained alone is not like for like: transformers maps the weights file and "
                  "reads each weight when it is first used, while headlab's attach runs a probe forward of the whole "
                  "model on a few tokens, which reads every weight; the rows with one short forward after each load "
                  "read every weight on both sides, and the bound row adds a forward of the probe's inputs to "
                  "transformers' side, which is what attach does beyond loading.")


def large_config(*, layers: int, d_model: int) -> Any:
    """A ``LlamaConfig`` of ``layers`` layers of width ``d_model``, in a 1B Llama's proportions.

    Raises:
        ValueError: ``d_model`` not a multiple of ``D_HEAD × QUERIES_PER_KV × 2`` (at least two key/value
            heads, so that half of them can be pruned), or ``layers`` < 1.
    """
    from transformers import LlamaConfig

    if layers < 1 or d_model < 1 or d_model % (D_HEAD * QUERIES_PER_KV * 2):
        raise ValueError(f"layers={layers!r}, d_model={d_model!r}; expected layers ≥ 1 and d_model a multiple of "
                         f"{D_HEAD * QUERIES_PER_KV * 2} (heads of {D_HEAD}, {QUERIES_PER_KV} per key/value head, at "
                         "least two key/value heads)")
    n_heads = d_model // D_HEAD
    return LlamaConfig(hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=n_heads,
                       num_key_value_heads=n_heads // QUERIES_PER_KV, intermediate_size=FFN_FACTOR * d_model,
                       vocab_size=VOCAB, use_cache=False, architectures=["LlamaForCausalLM"])


def build_large_model(config: Any, *, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Any:
    """A ``LlamaForCausalLM`` of ``config`` with random weights, in eval mode (sdpa), made without initialising
    anything twice.

    Args:
        config: ``large_config``'s.
        dtype: its parameters' dtype.
        device: where they live.
        seed: parameter i is drawn from a generator seeded ``seed + i`` (the same weights on every machine).

    Returns:
        The model: every matrix normal with std ``INIT_STD``, every vector (the norms' weights) ones.
    """
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model.to_empty(device=device)
    with torch.no_grad():
        for i, parameter in enumerate(model.parameters()):
            if parameter.ndim == 1:
                parameter.fill_(1.0)
            else:
                generator = torch.Generator(device=device).manual_seed(seed + i)
                parameter.normal_(0.0, INIT_STD, generator=generator)
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config).to(device)  # its table is computed, not a weight
    model.set_attn_implementation("sdpa")
    return model.eval()


def choose_dtype(config: Any, ids: Tensor, *, rounds: int, device: str = "cpu") -> tuple[str, dict[str, Timing]]:
    """Which of ``CANDIDATE_DTYPES`` runs one forward of ``config``'s model on ``ids`` faster here.

    Args:
        config: ``large_config``'s.
        ids: the input ``(batch, pos)``.
        rounds: interleaved rounds (one forward per contender each).
        device: where the models run.

    Returns:
        The faster dtype's name, and each dtype's forward time.
    """
    models = {name: build_large_model(config, dtype=getattr(torch, name), device=device) for name in CANDIDATE_DTYPES}
    with torch.inference_mode():
        times = time_interleaved({name: _forward(model, ids) for name, model in models.items()}, rounds=rounds,
                                 min_block_s=1e-6, warmup=0, device=device)
    return min(times, key=lambda name: times[name].median), times


def save_large_model(config: Any, folder: str | Path, *, dtype: torch.dtype, device: str = "cpu") -> Path:
    """``build_large_model`` saved with ``save_pretrained`` into ``folder``; the model is not kept.

    Returns:
        The folder (config.json and model.safetensors).
    """
    model = build_large_model(config, dtype=dtype, device=device)
    model.save_pretrained(folder)
    return Path(folder)


def half_the_groups(n_heads: int, n_kv_heads: int) -> list[int]:
    """The query heads of the second half of the key/value groups (query head h reads key/value head
    h // (n_heads / n_kv_heads)): pruning them removes half the query heads and half the key/value heads."""
    per_group = n_heads // n_kv_heads
    return [h for h in range(n_heads) if h // per_group >= n_kv_heads // 2]


def bench_large(plan: Plan, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Loading, running and pruning a large random Llama, against transformers' own.

    Args:
        plan: device, ``large_model``, ``large_shape`` and rounds (``rounds`` for the forwards; ``capture_rounds``,
            as for other passes that rebuild or reload a model, for loads and the dtype choice; ``memory_rounds``
            for peak memory).
        tick: progress.

    Returns:
        The "large" area.

    Raises:
        RuntimeError: a contender's outputs differ from its peer's, or the pruned checkpoint's from the
            pruned model it was saved from.
    """
    layers, d_model = plan.large_model
    batch, pos = plan.large_shape
    config = large_config(layers=layers, d_model=d_model)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, pos), generator=generator).to(plan.device)
    short = torch.randint(0, VOCAB, (1, SHORT_INPUT), generator=generator).to(plan.device)
    shapes = (f"random Llama, {layers} layers × {config.num_attention_heads} heads ({config.num_key_value_heads} kv "
              f"heads), d_model {d_model}, intermediate {config.intermediate_size}, vocabulary {VOCAB}")
    tick(f"large: choosing the dtype of {shapes}")
    dtype_name, dtype_times = choose_dtype(config, ids, rounds=plan.capture_rounds, device=plan.device)
    dtype = getattr(torch, dtype_name)
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="headlab-large-") as work:
        folder = save_large_model(config, Path(work) / "model", dtype=dtype, device=plan.device)
        pruned_folder, params = _save_pruned(folder, Path(work) / "pruned", dtype, plan.device, short)
        gc.collect()
        tick(f"large: loads of {shapes}")
        loads, load_memory = _loads(plan, folder, pruned_folder, dtype, short)
        tick(f"large: forwards of {shapes}")
        forwards, forward_memory = _forwards(plan, folder, dtype, ids)
        gc.collect()  # an attached model and its handle refer to each other: freed by a collection
    case = f"{shapes}, {params['full'] / 1e9:.2f} B parameters, {dtype_name}"
    forward_case = f"{case} · batch {batch} · pos {pos}"
    t32, t16 = (dtype_times[name].median for name in CANDIDATE_DTYPES)
    area = Area("large", "Large model: a 1B-class Llama loaded, run and pruned by headlab vs transformers", (
        f"A {shapes} ({params['full']:,} parameters; {params['pruned']:,} after pruning the query heads of half "
        f"the key/value groups of every layer), random weights (normal, std {INIT_STD}, seeded per parameter), "
        f"built on the meta device and saved on the fly (not timed); on {plan.device}. dtype {dtype_name}: one "
        f"forward of batch {batch} × {pos} positions took {t32:.3g} s in float32 and {t16:.3g} s in bfloat16 "
        f"(median of {plan.capture_rounds} interleaved rounds), and the faster one runs everywhere below. Loads: "
        f"one interleaved group ({plan.capture_rounds} rounds, median; a garbage collection ends every load, "
        "so that one model is freed before the next), peak resident memory in "
        f"{plan.memory_rounds} rounds. Forwards: the attached model's decoder stack (no vocabulary projection) "
        f"against itself switched to transformers' sdpa, outputs checked equal first ({plan.rounds} rounds, "
        "median). The A/A rows time transformers against itself: their distance from 1.00 is this run's "
        "noise."))
    area.rows += _load_rows(case, loads, load_memory)
    area.rows += _forward_rows(forward_case, forwards, forward_memory, tokens=batch * pos)
    area.rows.append(Comparison(forward_case, "one forward in bfloat16 (plain, the dtype choice)",
                                "one forward in float32", dtype_times["bfloat16"], dtype_times["float32"],
                                tokens=batch * pos))
    area.notes.append(LAZY_LOAD_NOTE)
    unmeasured = peak_memory_available(plan.device)
    if unmeasured is not None:
        area.notes.append(f"Peak memory not measured: {unmeasured}.")
    _note_misses(area)
    return area


def _forward(model: nn.Module, ids: Tensor) -> Callable[[], Any]:
    """One forward of ``model``'s decoder stack (a causal LM's ``.model``) on ``ids``."""
    stack: Any = getattr(model, "model", model)
    return lambda: stack(input_ids=ids)


def _save_pruned(folder: Path, pruned: Path, dtype: torch.dtype, device: str,
                 short: Tensor) -> tuple[Path, dict[str, int]]:
    """The checkpoint of ``folder`` with ``half_the_groups`` pruned in every layer, saved by ``headlab.heads.save``
    into ``pruned`` and checked to load back to the same outputs; and both models' parameter counts."""
    import headlab
    from headlab import heads

    loaded = headlab.load(folder, dtype=dtype, device=device)
    params = {"full": sum(p.numel() for p in loaded.model.parameters())}
    config: Any = loaded.model.config
    heads.prune(loaded, {site.layer: half_the_groups(config.num_attention_heads, config.num_key_value_heads)
                         for site in loaded.sites})
    params["pruned"] = sum(p.numel() for p in loaded.model.parameters())
    heads.save(loaded, pruned)
    again = headlab.load(pruned, dtype=dtype, device=device)
    with torch.inference_mode():
        check_same("the pruned checkpoint", {"pruned in memory": _forward(loaded.model, short)().last_hidden_state,
                                             "pruned, saved and loaded": _forward(again.model, short)()
                                             .last_hidden_state}, dtype)
    return pruned, params


def _loads(plan: Plan, folder: Path, pruned: Path, dtype: torch.dtype,
           short: Tensor) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Times of the loads (and of each followed by one short forward), then their peak memory."""
    from transformers import AutoModelForCausalLM

    import headlab
    from headlab.models.probe import probe_inputs

    def theirs() -> nn.Module:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa",
                                                     use_safetensors=True)
        return model.to(plan.device).eval()

    def ours(path: Path) -> Callable[[], nn.Module]:
        return lambda: headlab.load(path, dtype=dtype, device=plan.device).model

    def load(make: Callable[[], nn.Module], *, forward: bool = False, probe: bool = False) -> Callable[[], None]:
        def once() -> None:
            model = make()
            with torch.inference_mode():
                if probe:  # what attach's probe runs: the whole model on a few tokens
                    model(**probe_inputs(model))
                if forward:
                    _forward(model, short)()
            del model
            gc.collect()
        return once

    contenders = {"plain": load(theirs), "plain again": load(theirs), "headlab": load(ours(folder)),
                  "headlab pruned": load(ours(pruned)), "plain + forward": load(theirs, forward=True),
                  "headlab + forward": load(ours(folder), forward=True),
                  "plain + probe + forward": load(theirs, forward=True, probe=True)}
    times = time_interleaved(contenders, rounds=plan.capture_rounds, min_block_s=1e-6, warmup=0, device=plan.device)
    if peak_memory_available(plan.device) is not None:
        return times, {}
    memory = peak_memory_interleaved({name: contenders[name] for name in ("plain", "headlab", "headlab pruned",
                                                                          "plain + forward", "headlab + forward")},
                                     rounds=plan.memory_rounds, device=plan.device)
    return times, memory


def _forwards(plan: Plan, folder: Path, dtype: torch.dtype,
              ids: Tensor) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Times of the attached model's forwards (nothing inspected, head 0 of every layer tapped) and of the same
    model under transformers' sdpa, checked equal first; then their peak memory."""
    import headlab
    from headlab.capture.taps import tapped

    loaded = headlab.load(folder, dtype=dtype, device=plan.device)
    model, sites = loaded.model, loaded.sites
    every_layer = {site.layer: [0] for site in sites}

    def discard(layer: int, taken: object) -> None:
        pass

    def run(implementation: str | None, *, tap: bool = False) -> Callable[[], None]:
        def once() -> None:
            with nullcontext() if implementation is None else running(model, implementation), \
                    tapped(sites, every_layer, ("pattern",), discard) if tap else nullcontext():
                _forward(model, ids)()
        return once

    with torch.inference_mode():
        with running(model, "sdpa"):
            plain = _forward(model, ids)().last_hidden_state
        with tapped(sites, every_layer, ("pattern",), discard):
            one_head = _forward(model, ids)().last_hidden_state
        check_same("the large model", {"plain transformers (sdpa)": plain,
                                       "headlab attached": _forward(model, ids)().last_hidden_state,
                                       "headlab attached, head 0 tapped in every layer": one_head}, dtype)
        del plain, one_head
        contenders = {"plain": run("sdpa"), "plain again": run("sdpa"), "attached": run(None),
                      "one head every layer": run(None, tap=True)}
        times = time_interleaved(contenders, rounds=plan.rounds, min_block_s=plan.min_block_s, warmup=0,
                                 device=plan.device)
        if peak_memory_available(plan.device) is not None:
            return times, {}
        memory = peak_memory_interleaved({name: contenders[name] for name in ("plain", "attached",
                                                                              "one head every layer")},
                                         rounds=plan.memory_rounds, device=plan.device)
    return times, memory


def _load_rows(case: str, t: dict[str, Timing], memory: dict[str, Timing]) -> list[Comparison]:
    plain, ours = "transformers from_pretrained (sdpa)", "headlab.load (attached)"
    rows = [
        Comparison(case, "A/A: transformers from_pretrained (timing noise)", plain, t["plain again"], t["plain"]),
        Comparison(case, ours, plain, t["headlab"], t["plain"], goal=LOAD_GOAL),
        Comparison(case, f"{ours} + one forward of {SHORT_INPUT} tokens", f"{plain} + one forward of {SHORT_INPUT} "
                   "tokens", t["headlab + forward"], t["plain + forward"], goal=LOAD_GOAL),
        Comparison(case, f"{ours} + one forward of {SHORT_INPUT} tokens", f"{plain} + a forward of attach's probe "
                   f"inputs + one forward of {SHORT_INPUT} tokens (the bound)", t["headlab + forward"],
                   t["plain + probe + forward"]),
        Comparison(case, "headlab.load, half the heads pruned (headlab.heads.save)", "headlab.load, unpruned",
                   t["headlab pruned"], t["headlab"], goal=PRUNED_LOAD_GOAL),
    ]
    if memory:
        rows += [
            Comparison(case, "peak memory of headlab.load, half the heads pruned", "peak memory of headlab.load, "
                       "unpruned", memory["headlab pruned"], memory["headlab"], goal=PRUNED_MEMORY_GOAL,
                       unit="bytes"),
            Comparison(case, "peak memory of headlab.load (attached)", f"peak memory of {plain}", memory["headlab"],
                       memory["plain"], unit="bytes"),
            Comparison(case, f"peak memory of headlab.load (attached) + one forward of {SHORT_INPUT} tokens",
                       f"peak memory of {plain} + one forward of {SHORT_INPUT} tokens", memory["headlab + forward"],
                       memory["plain + forward"], unit="bytes"),
        ]
    return rows


def _forward_rows(case: str, t: dict[str, Timing], memory: dict[str, Timing], *, tokens: int) -> list[Comparison]:
    sdpa = "plain transformers (sdpa)"
    rows = [
        Comparison(case, "A/A: plain transformers (timing noise)", sdpa, t["plain again"], t["plain"], tokens=tokens),
        Comparison(case, "headlab attached, nothing inspected", sdpa, t["attached"], t["plain"], goal=ATTACHED_GOAL,
                   tokens=tokens),
        Comparison(case, "headlab attached, one head's pattern in every layer (head 0)", sdpa,
                   t["one head every layer"], t["plain"], goal=ONE_HEAD_GOAL, tokens=tokens),
    ]
    if memory:
        rows += [
            Comparison(case, "peak memory of the attached forward, nothing inspected", f"peak memory of the {sdpa} "
                       "forward", memory["attached"], memory["plain"], unit="bytes"),
            Comparison(case, "peak memory of the attached forward, head 0 of every layer tapped", "peak memory of "
                       f"the {sdpa} forward", memory["one head every layer"], memory["plain"], unit="bytes"),
        ]
    return rows


def _note_misses(area: Area) -> None:
    """A note per missed goal, beside the A/A row of its group (timings) so that noise is not read as a cost."""
    noise = {row.case: row.ratio for row in area.rows if row.contender.startswith("A/A")}
    for row in area.rows:
        if row.met() is False:
            beside = f"; the A/A row of its group measured {noise[row.case]:.3f}×" if row.unit == "s" else ""
            area.notes.append(f"{row.contender} vs {row.peer} took {row.ratio:.3f}× (goal ≤ {row.goal:.2f}){beside}.")
