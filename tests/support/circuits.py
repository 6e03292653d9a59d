"""Circuits with a known answer: planted in tiny random transformers, and the induction experiment's.

- ``random_pair(name)``: a tiny random model in float64, a clean and a corrupted input, a logit metric.
- ``planted(name)``: a tiny GPT-2 or grouped-query LLaMA whose only working heads are A = L0 H0 and
  B = L1 H1, with A feeding B through B's query: token embeddings live in dims 0..15; A attends
  uniformly (zero q, k) and writes its values of the tokens into dims 16..23; B's query reads dims
  16..23 only, its key and value read the tokens, and it writes back into the tokens' dims, which the
  unembedding reads. A writes +u into dims 16..23 and −u into 24..31, so that a LayerNorm's mean does not
  carry it into the tokens' dims, and small, so that the norms' scales hardly move. The MLPs write
  nothing. Corrupting an early token changes A's output, hence B's query: the one head → head edge that
  matters is A → B.q.
- ``induction()``: the induction experiment's trained 2-layer model (quick) on its circuit pair
  (``headlab.experiments.induction.induction_pair``).
- ``tiny_edges(kind)``: EAP scores of ``tiny(kind)`` (a model with a tokenizer: the viewer's circuit panel)
  on two texts one word apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import headlab
from headlab.circuits.graph import EdgeScores
from headlab.models import HeadedModel
from tests.support.tiny import build, tiny

A, B = (0, 0), (1, 1)  # the planted sender and receiver heads
# how strongly A writes and B's query reads: a LayerNorm's scale moves with everything written, so in GPT-2
# A writes small and B reads it with a large gain
GAINS = {"gpt2": (0.3, 12.0), "llama": (3.0, 3.0)}
TOKENS, WRITTEN, MIRROR = slice(0, 16), slice(16, 24), slice(24, 32)  # the tokens' dims, and the dims A writes


def random_pair(name: str = "gpt2", *, std: float = 0.2) -> tuple[HeadedModel, torch.Tensor, torch.Tensor,
                                                                   Callable[[Any], torch.Tensor]]:
    """A tiny random ``name`` in float64, two items of 8 tokens and the same with token 2 changed, and a logit
    difference at the last position."""
    handle = headlab.attach(build(name, std=std).double())
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(3, 100, (2, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 100, (2,), generator=generator)

    def metric(output: Any) -> torch.Tensor:
        return (output.logits[:, -1, 5] - output.logits[:, -1, 7]).mean()

    return handle, clean, corrupted, metric


def planted(name: str) -> tuple[HeadedModel, torch.Tensor, torch.Tensor, Callable[[Any], torch.Tensor]]:
    """``(handle, clean ids, corrupted ids, metric)`` of the planted circuit in a tiny ``name`` ("gpt2" or
    "llama"), in float64."""
    generator = torch.Generator().manual_seed(3)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

    write, read = GAINS[name]
    model = build(name, seed=3).double()
    with torch.no_grad():
        for parameter_name, p in model.named_parameters():
            is_norm_weight = "norm" in parameter_name or ".ln_" in parameter_name or "ln_f" in parameter_name
            p.fill_(1.0 if is_norm_weight and parameter_name.endswith("weight") else 0.0)
        d_head = 8
        eye = torch.eye(d_head, dtype=torch.float64) * write
        if name == "gpt2":
            blocks = model.transformer.h
            model.transformer.wte.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            a_attn, b_attn = blocks[A[0]].attn, blocks[B[0]].attn
            v_a = slice(64 + A[1] * d_head, 64 + (A[1] + 1) * d_head)
            a_attn.c_attn.weight[TOKENS, v_a] = rand(16, d_head)
            a_attn.c_proj.weight[A[1] * d_head:(A[1] + 1) * d_head, WRITTEN] = eye
            a_attn.c_proj.weight[A[1] * d_head:(A[1] + 1) * d_head, MIRROR] = -eye
            head = slice(B[1] * d_head, (B[1] + 1) * d_head)
            b_attn.c_attn.weight[WRITTEN, head] = rand(d_head, d_head, scale=read)  # query
            b_attn.c_attn.weight[TOKENS, 32 + B[1] * d_head: 32 + (B[1] + 1) * d_head] = rand(16, d_head)  # key
            b_attn.c_attn.weight[TOKENS, 64 + B[1] * d_head: 64 + (B[1] + 1) * d_head] = rand(16, d_head)  # value
            b_attn.c_proj.weight[head, TOKENS] = rand(d_head, 16)
        else:  # llama: query head h reads key/value head h // 2
            layers = model.model.layers
            model.model.embed_tokens.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            model.lm_head.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            a_attn, b_attn = layers[A[0]].self_attn, layers[B[0]].self_attn
            kv_a, kv_b = A[1] // 2, B[1] // 2
            a_attn.v_proj.weight[kv_a * d_head:(kv_a + 1) * d_head, TOKENS] = rand(d_head, 16)
            a_attn.o_proj.weight[WRITTEN, A[1] * d_head:(A[1] + 1) * d_head] = eye
            a_attn.o_proj.weight[MIRROR, A[1] * d_head:(A[1] + 1) * d_head] = -eye
            head = slice(B[1] * d_head, (B[1] + 1) * d_head)
            b_attn.q_proj.weight[head, WRITTEN] = rand(d_head, d_head, scale=read)
            b_attn.k_proj.weight[kv_b * d_head:(kv_b + 1) * d_head, TOKENS] = rand(d_head, 16)
            b_attn.v_proj.weight[kv_b * d_head:(kv_b + 1) * d_head, TOKENS] = rand(d_head, 16)
            b_attn.o_proj.weight[TOKENS, head] = rand(16, d_head)
    handle = headlab.attach(model)
    clean = torch.randint(3, model.config.vocab_size, (4, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(3, model.config.vocab_size, (4,), generator=generator)

    def metric(output: Any) -> torch.Tensor:
        logits = output.logits[:, -3:]  # (batch, 3, vocab): the last positions read B's output
        return (logits[..., 5] - logits[..., 7]).mean()

    return handle, clean, corrupted, metric


@functools.cache
def _trained() -> Any:
    from headlab.experiments.induction import run_induction

    return run_induction(quick=True)


def induction() -> tuple[HeadedModel, torch.Tensor, torch.Tensor, Callable[[Any], torch.Tensor],
                         set[tuple[int, int]], set[tuple[int, int]]]:
    """``(handle, clean, corrupted, metric, previous-token heads, induction heads)`` of the induction experiment's
    trained model (trained once per test session) on its circuit pair (``induction_pair``); the heads are those
    headlab's detectors find (``InductionResult.previous_token_heads``, ``induction_heads``)."""
    from headlab.experiments.induction import induction_pair

    result = _trained()
    pair = induction_pair(result)
    previous = {(layer, head) for layer, head in result.previous_token_heads}
    inducing = {(layer, head) for layer, head in result.induction_heads}
    return headlab.attach(result.model), pair.clean, pair.corrupted, pair.metric, previous, inducing


CLEAN, CORRUPTED = "the big red dog ran on the mat", "the big red cat ran on the mat"  # one word apart, as many pieces


@functools.cache
def tiny_edges(kind: str) -> EdgeScores:
    """EAP scores of ``tiny(kind)`` on ``CLEAN`` against ``CORRUPTED``, the metric a logit difference at the
    changed word; once per session."""
    from headlab.circuits import edge_attribution

    def metric(output: Any) -> torch.Tensor:
        return (output.logits[:, 4, 5] - output.logits[:, 4, 7]).mean()  # position 4: "dog" / "cat"

    return edge_attribution(tiny(kind), CLEAN, CORRUPTED, metric)


# --- models of one stream beyond the text decoders: vision transformers and a module run in several layers ---
FAMILY_PAIRS = ("vit", "clip_vision", "albert")  # pre-norm vision, a vision model output by no norm, ALBERT


def family_model(name: str) -> Any:
    """``FAMILIES[name]``'s tiny random model in float64 with transformers' own attention (sdpa: the eager one takes
    its softmax in float32), its weights ten times as large as the default (so that a head's q and k matter)."""
    from tests.support.families import FAMILIES

    return FAMILIES[name].build("sdpa", torch.float64, initializer_range=0.2)


def family_pair(name: str) -> tuple[HeadedModel, dict[str, torch.Tensor], dict[str, torch.Tensor],
                                    Callable[[Any], torch.Tensor]]:
    """A tiny random ``name`` of ``FAMILY_PAIRS`` (or "bart") attached, in float64; a clean input of two items and a
    corrupted one (one patch of the image changed, or one token of the source); the metric: the last position's first
    8 features of the output's hidden states, summed."""
    handle = headlab.attach(family_model(name))
    generator = torch.Generator().manual_seed(0)
    if name in ("albert", "bart"):
        ids = torch.randint(3, 100, (2, 8), generator=generator)
        corrupted_ids = ids.clone()
        corrupted_ids[:, 2] = torch.randint(3, 100, (2,), generator=generator)
        clean, corrupted = {"input_ids": ids}, {"input_ids": corrupted_ids}
        if name == "bart":  # the decoder reads the same target in both runs: the source changes
            clean["decoder_input_ids"] = corrupted["decoder_input_ids"] = ids[:, :5]
    else:
        pixels = torch.randn(2, 3, 16, 16, generator=generator, dtype=torch.float64)
        changed = pixels.clone()
        changed[..., :4, :4] = torch.randn(2, 3, 4, 4, generator=generator, dtype=torch.float64)  # one patch
        clean, corrupted = {"pixel_values": pixels}, {"pixel_values": changed}

    def metric(output: Any) -> torch.Tensor:
        return output.last_hidden_state[:, -1, :8].sum(-1).mean()

    return handle, clean, corrupted, metric


Place = tuple[str, int]  # a module's dotted name and which of its calls in one forward


def _places(name: str, layer: int) -> dict[str, Place]:
    """Where layer ``layer``'s heads read the stream (the norm whose input it is; not BART's), its q, k, v and output
    projections, written out per family from transformers' modules (independently of ``headlab.models.stream``)."""
    if name == "bart":  # encoder 0, 1; decoder self 2, 4, cross 3, 5
        stack, block = ("encoder", layer) if layer < 2 else ("decoder", (layer - 2) // 2)
        attention = f"{stack}.layers.{block}." + ("encoder_attn" if layer in (3, 5) else "self_attn")
        return {**{r: (f"{attention}.{r}_proj", 0) for r in "qkv"}, "o": (f"{attention}.out_proj", 0)}
    if name == "albert":  # 4 layers in 2 groups of one shared layer each: layer L is group L // 2's call L % 2
        group = "encoder.albert_layer_groups.{}.albert_layers.0"
        attention = group.format(layer // 2) + ".attention"
        before = layer - 1  # a post-norm layer reads the previous layer's normalised output
        return {"norm": (group.format(before // 2) + ".full_layer_layer_norm", before % 2),
                "q": (attention + ".query", layer % 2), "k": (attention + ".key", layer % 2),
                "v": (attention + ".value", layer % 2), "o": (attention + ".dense", layer % 2)}
    if name == "vit":
        block, attention, norm, out = f"layers.{layer}", "attention", "layernorm_before", "o_proj"
    else:  # clip_vision
        block, attention, norm, out = f"encoder.layers.{layer}", "self_attn", "layer_norm1", "out_proj"
    return {"norm": (f"{block}.{norm}", 0), **{r: (f"{block}.{attention}.{r}_proj", 0) for r in "qkv"},
            "o": (f"{block}.{attention}.{out}", 0)}


# where the output reads the stream: a module's input (a final norm) or its output (CLIP's last layer), and its call
FINAL = {"vit": ("layernorm", 0, "input"), "clip_vision": ("encoder.layers.1", 0, "output"),
         "albert": ("encoder.albert_layer_groups.1.albert_layers.0.full_layer_layer_norm", 1, "input")}
N_LAYERS, D_HEAD = {"vit": 2, "clip_vision": 2, "albert": 4, "bart": 6}, 8


def _on_calls(model: Any, hooks: list[tuple[Place, Callable[..., Any], bool]]) -> list[Any]:
    """Torch hooks on the chosen calls of modules (``(place, hook, pre)``), counted from the next forward on."""
    handles = []
    for (path, call), hook, pre in hooks:
        count = [0]

        def counted(module: Any, args: Any, *output: Any, hook: Any = hook, call: int = call,
                    count: list[int] = count) -> Any:
            count[0] += 1
            return hook(module, args, *output) if count[0] - 1 == call else None

        module = model.get_submodule(path)
        handles.append(module.register_forward_pre_hook(counted) if pre else module.register_forward_hook(counted))
    return handles


def _forward(model: Any, inputs: dict[str, torch.Tensor], hooks: list[tuple[Place, Callable[..., Any], bool]]) -> Any:
    handles = _on_calls(model, hooks)
    try:
        with torch.no_grad():
            return model(**inputs)
    finally:
        for handle in handles:
            handle.remove()


def _z(model: Any, name: str, inputs: dict[str, torch.Tensor]) -> tuple[dict[int, torch.Tensor], Any]:
    """Every layer's merged z (its output projection's input) and the output."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [(_places(name, layer)["o"], lambda m, args, layer=layer: seen.__setitem__(layer, args[0].clone()), True)
             for layer in range(N_LAYERS[name])]
    output = _forward(model, inputs, hooks)
    return seen, output


def _heads(head: int) -> slice:
    return slice(head * D_HEAD, (head + 1) * D_HEAD)


# the module whose output is the stream the input enters with (CLIP's is normalised before the first layer)
ENTRY = {"vit": "embeddings", "clip_vision": "pre_layrnorm", "albert": "encoder.embedding_hidden_mapping_in"}


def entering(name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The stream ``inputs`` enter the first layer with: ``ENTRY[name]``'s output."""
    seen: dict[str, torch.Tensor] = {}
    _forward(family_model(name), inputs, [((ENTRY[name], 0), lambda m, a, out: seen.__setitem__("x", out), False)])
    return seen["x"]


def edge_reference(name: str, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor],
                   metric: Callable[[Any], torch.Tensor], sender: tuple[int, int], receiver: Any, *,
                   scale: float = 1.0, entry: torch.Tensor | None = None) -> float:
    """Edge patching written with hooks on transformers' own modules: the corrupted run in which the receiver alone
    reads the stream plus ``scale`` times the sender's clean − corrupted result (its z through its columns of the
    output projection); the metric's change. ``entry``: the stream the corrupted run enters with instead of its own
    (``ENTRY``)."""
    model = family_model(name)
    (clean_z, _), (base_z, _) = _z(model, name, clean), _z(model, name, corrupted)
    out = model.get_submodule(_places(name, sender[0])["o"][0])
    columns = _heads(sender[1])
    added = scale * (clean_z[sender[0]][..., columns] - base_z[sender[0]][..., columns]) @ out.weight[:, columns].T
    entered = [] if entry is None else [((ENTRY[name], 0), lambda m, a, out: entry, False)]
    base = _forward(model, corrupted, entered)
    if receiver == "output":
        path, call, where = FINAL[name]
        if where == "input":
            hook = (lambda m, args: (args[0] + added, *args[1:])), True
        else:
            hook = (lambda m, args, output: (output + added) if isinstance(output, torch.Tensor)
                    else (output[0] + added, *output[1:])), False
        patched = _forward(model, corrupted, [*entered, ((path, call), *hook)])
        return float(metric(patched)) - float(metric(base))
    layer, head, role = receiver
    places, stream = _places(name, layer), {}
    norm = model.get_submodule(places["norm"][0])

    def own(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        mine = module.forward(norm.forward(stream["x"] + added))  # .forward: no hook sees the extra calls
        output = output.clone()
        output[..., _heads(head)] = mine[..., _heads(head)]
        return output

    patched = _forward(model, corrupted, [*entered, (places["norm"], lambda m, args: stream.__setitem__("x", args[0]),
                                                                     True), (places[role], own, False)])
    return float(metric(patched)) - float(metric(base))


def path_reference(name: str, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor],
                   metric: Callable[[Any], torch.Tensor], sender: tuple[int, int],
                   receiver: tuple[int, int, str]) -> float:
    """Path patching written with hooks: the corrupted run with the sender's z from the clean run and every other
    head's z frozen to the corrupted run's, the receiver's q (k, v) recorded; then the corrupted run with that
    input; the metric's change."""
    model = family_model(name)
    (clean_z, _), (base_z, base) = _z(model, name, clean), _z(model, name, corrupted)

    def frozen(layer: int) -> Callable[..., Any]:
        def hook(module: Any, args: Any) -> Any:
            z = base_z[layer].clone()
            if layer == sender[0]:
                z[..., _heads(sender[1])] = clean_z[layer][..., _heads(sender[1])]
            return (z, *args[1:])
        return hook

    layer, head, role = receiver
    place, recorded = _places(name, layer)[role], {}
    _forward(model, corrupted, [*((_places(name, i)["o"], frozen(i), True) for i in range(N_LAYERS[name])),
                                (place, lambda m, a, out: recorded.__setitem__("x", out[..., _heads(head)].clone()),
                                 False)])

    def replace(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., _heads(head)] = recorded["x"]
        return output

    return float(metric(_forward(model, corrupted, [(place, replace, False)]))) - float(metric(base))
