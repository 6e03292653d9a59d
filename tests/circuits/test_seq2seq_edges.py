"""The edge graph of an encoder-decoder (headlab.circuits on a tiny random BART and T5, float64): two streams, against
references written with hooks on transformers' own modules (independently of headlab.models.stream):

- the graph: each stack's input and heads send into their own stream; a cross-attention head's k and v read the
  encoder's (every encoder head and the encoder's input), its q the decoder's; no decoder head sends to an encoder
  head; the output reads the decoder's stream;
- edge patching of an edge of every kind (encoder → encoder, encoder → a cross-attention head's k and v through the
  encoder's final norm, the decoder's input → a head, decoder → decoder, → the output) equals the reference;
- EAP's score of each is the slope of the reference at zero (by autograd through the reference's hooks: T5's norm
  takes its variance in float32, too coarse for finite differences); one step of EAP-IG is that slope with both
  streams' inputs entering halfway between the runs'; EAP and EAP-IG with many steps rank the edges as edge
  patching does;
- a circuit of every edge is the clean run, and of every edge but one the reference with the runs swapped (that
  edge noised); with a shared target the decoder's input sends nothing;
- (source, target) text pairs run; a model of several towers is refused in one line, targets of different lengths too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from scipy.stats import spearmanr

import headlab
from headlab.circuits.circuit import faithfulness, top_edges
from headlab.circuits.edges import edge_attribution, edge_patching
from headlab.circuits.graph import INPUT, OUTPUT, Edge, graph_edges
from tests.support.families import FAMILIES

DECODER_INPUT = "decoder input"
SCALE = {"bart": {"initializer_range": 0.1}, "t5": {"initializer_factor": 1.0}}  # q and k matter, nothing saturates
D_HEAD = 8
# layers: encoder 0, 1; decoder self-attention 2, 4; cross-attention 3, 5
EDGES = [Edge((0, 1), (1, 2, "q")), Edge((0, 3), (1, 0, "k")), Edge((0, 2), (3, 1, "k")), Edge((1, 3), (5, 0, "v")),
         Edge(INPUT, (3, 2, "v")), Edge(DECODER_INPUT, (2, 1, "k")), Edge((2, 1), (3, 0, "q")),
         Edge((3, 1), (4, 2, "v")), Edge((4, 0), OUTPUT), Edge((5, 3), OUTPUT)]


def _model(name: str) -> Any:
    return FAMILIES[name].build("sdpa", torch.float64, **SCALE[name])


def _pair(name: str, *, shared_target: bool = False) -> tuple[Any, dict[str, torch.Tensor], dict[str, torch.Tensor],
                                                             Callable[[Any], torch.Tensor]]:
    """The tiny ``name`` attached; a clean (source, target) of two items and a corrupted one (one source token and,
    unless ``shared_target``, one target token changed); the metric: the decoder's last position's first 8
    features."""
    handle = headlab.attach(_model(name))
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(3, 100, (2, 8), generator=generator)
    target = torch.randint(3, 100, (2, 5), generator=generator)
    changed_source, changed_target = source.clone(), target.clone()
    changed_source[:, 2] = torch.randint(3, 100, (2,), generator=generator)
    if not shared_target:
        changed_target[:, 1] = torch.randint(3, 100, (2,), generator=generator)
    clean = {"input_ids": source, "decoder_input_ids": target}
    corrupted = {"input_ids": changed_source, "decoder_input_ids": changed_target}

    def metric(output: Any) -> torch.Tensor:
        return output.last_hidden_state[:, -1, :8].sum(-1).mean()

    return handle, clean, corrupted, metric


# --- the reference: transformers' modules and torch hooks ---------------------------------------------------------

def _places(name: str, layer: int) -> dict[str, str]:
    """Layer ``layer``'s attention module and the norm whose input is the stream its heads read (its query's), written
    out per family."""
    stack, block = ("encoder", layer) if layer < 2 else ("decoder", (layer - 2) // 2)
    cross = layer in (3, 5)
    if name == "bart":  # post-norm: a layer reads the norm that ends the sublayer before it
        norms = {0: "encoder.layernorm_embedding", 1: "encoder.layers.0.final_layer_norm",
                 2: "decoder.layernorm_embedding", 3: "decoder.layers.0.self_attn_layer_norm",
                 4: "decoder.layers.0.final_layer_norm", 5: "decoder.layers.1.self_attn_layer_norm"}
        return {"attention": f"{stack}.layers.{block}." + ("encoder_attn" if cross else "self_attn"),
                "norm": norms[layer], "o": "out_proj"}
    sublayer = f"{stack}.block.{block}.layer.{1 if cross else 0}"
    return {"attention": sublayer + (".EncDecAttention" if cross else ".SelfAttention"),
            "norm": sublayer + ".layer_norm", "o": "o"}


# the norm that makes what cross-attention's keys read (the encoder's output), and the one the output reads through
MEMORY = {"bart": "encoder.layers.1.final_layer_norm", "t5": "encoder.final_layer_norm"}
FINAL = {"bart": "decoder.layers.1.final_layer_norm", "t5": "decoder.final_layer_norm"}
PROJECTION = {"bart": "{}_proj", "t5": "{}"}


def _projection(model: Any, name: str, layer: int, role: str) -> Any:
    places = _places(name, layer)
    return model.get_submodule(f"{places['attention']}.{PROJECTION[name].format(role) if role != 'o' else places['o']}")


def _forward(model: Any, inputs: dict[str, torch.Tensor], hooks: list[tuple[Any, Callable[..., Any], bool]], *,
             grad: bool = False) -> Any:
    """A forward with ``(module, hook, pre)`` hooks on it (with gradients where ``grad``); a hook on a module called
    twice (T5's shared embedding) sees each call."""
    handles = [module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
               for module, hook, pre in hooks]
    try:
        with torch.set_grad_enabled(grad):
            return model(**inputs)
    finally:
        for handle in handles:
            handle.remove()


def _halfway(model: Any, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor]
             ) -> list[tuple[Any, Callable[..., Any], bool]]:
    """Hooks on the token embeddings that give the encoder's and the decoder's call the mean of the two runs'
    embeddings: the stream each stack's input enters with moves halfway (an affine map of them in BART, the same in
    T5). One module called by both (T5's shared embedding) gives the source's, then the target's."""
    modules = (model.encoder.embed_tokens, model.decoder.embed_tokens)
    with torch.no_grad():
        means = [(m(clean[key]) + m(corrupted[key])) / 2 for m, key in zip(modules, ("input_ids", "decoder_input_ids"))]
    if modules[0] is modules[1]:
        calls = iter(means)
        return [(modules[0], lambda module, args, output: next(calls), False)]
    return [(module, lambda m, args, output, mean=mean: mean, False) for module, mean in zip(modules, means)]


def _sent(model: Any, name: str, inputs: dict[str, torch.Tensor], sender: Any) -> torch.Tensor:
    """What ``sender`` sends: a head's result (its z, the output projection's input, through its columns), or an
    input's stream where its stack's first layer reads it."""
    seen: dict[str, torch.Tensor] = {}
    if isinstance(sender, str):
        module = model.get_submodule(_places(name, 0 if sender == INPUT else 2)["norm"])

        def hook(m: Any, args: Any) -> None:
            seen["x"] = args[0].clone()
    else:
        module, columns = _projection(model, name, sender[0], "o"), slice(sender[1] * D_HEAD, (sender[1] + 1) * D_HEAD)

        def hook(m: Any, args: Any) -> None:
            seen["x"] = args[0][..., columns] @ m.weight[:, columns].T

    _forward(model, inputs, [(module, hook, True)])
    return seen["x"]


def _reference(name: str, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor],
               metric: Callable[[Any], torch.Tensor], edge: Edge, *, scale: float | torch.Tensor = 1.0,
               halfway: bool = False) -> torch.Tensor:
    """Edge patching with hooks: the corrupted run in which the receiver alone reads its stream plus ``scale`` times
    the sender's clean − corrupted value; the metric's change (in the autograd graph of ``scale``, a tensor that
    wants gradients). A cross-attention head's k or v: its projection of the encoder's final norm run on the encoder's
    final stream plus the difference. ``halfway``: the corrupted run's inputs enter halfway to the clean run's."""
    model = _model(name)

    def entering() -> list[tuple[Any, Callable[..., Any], bool]]:  # fresh hooks per forward (they count the calls)
        return _halfway(model, clean, corrupted) if halfway else []

    added = scale * (_sent(model, name, clean, edge.sender) - _sent(model, name, corrupted, edge.sender))
    grad = isinstance(scale, torch.Tensor)
    base = float(metric(_forward(model, corrupted, entering())))
    if edge.receiver == OUTPUT:
        final = model.get_submodule(FINAL[name])
        patched = _forward(model, corrupted, [*entering(), (final, lambda m, args: (args[0] + added,), True)],
                           grad=grad)
        return metric(patched) - base
    layer, head, role = edge.receiver
    cross = layer in (3, 5) and role != "q"
    norm = model.get_submodule(MEMORY[name] if cross else _places(name, layer)["norm"])
    stream: dict[str, torch.Tensor] = {}
    columns = slice(head * D_HEAD, (head + 1) * D_HEAD)

    def own(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        mine = module.forward(norm.forward(stream["x"] + added))  # .forward: no hook sees the extra calls
        output = output.clone()
        output[..., columns] = mine[..., columns]
        return output

    patched = _forward(model, corrupted, [*entering(), (norm, lambda m, args: stream.__setitem__("x", args[0]), True),
                                          (_projection(model, name, layer, role), own, False)], grad=grad)
    return metric(patched) - base


def _slope(name: str, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor],
           metric: Callable[[Any], torch.Tensor], edge: Edge, *, halfway: bool = False) -> float:
    """d/dt at t = 0 of the reference with the edge carrying t times the difference."""
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    return float(torch.autograd.grad(_reference(name, clean, corrupted, metric, edge, scale=t, halfway=halfway), t)[0])


# --- the tests ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bart", "t5"])
def test_the_graph_joins_the_two_streams_through_cross_attention(name):
    handle = headlab.attach(_model(name))
    edges = graph_edges(handle)

    def senders(receiver):
        return {e.sender for e in edges if e.receiver == receiver}

    encoder = {INPUT, *((layer, h) for layer in (0, 1) for h in range(4))}
    assert senders((3, 2, "k")) == senders((5, 0, "v")) == encoder  # the encoder's final stream, whole
    assert senders((3, 2, "q")) == {DECODER_INPUT, *((2, h) for h in range(4))}
    assert senders((4, 1, "v")) == {DECODER_INPUT, *((layer, h) for layer in (2, 3) for h in range(4))}
    assert senders(OUTPUT) == {DECODER_INPUT, *((layer, h) for layer in (2, 3, 4, 5) for h in range(4))}
    assert senders((1, 0, "q")) == {INPUT, *((0, h) for h in range(4))}
    assert not [e for e in edges if e.sender not in (INPUT, DECODER_INPUT) and e.receiver != OUTPUT
                and e.sender[0] >= 2 and e.receiver[0] < 2]  # no decoder head sends to the encoder
    # 4 heads a receiver; q, k, v of layers 0 to 5 by their senders; the output's 17
    assert len(edges) == len(set(edges)) == 4 * (3 * 1 + 3 * 5 + 3 * 1 + (5 + 9 + 9) + 3 * 9 + (13 + 9 + 9)) + 17
    assert Edge(DECODER_INPUT, (2, 1, "k")).label == "decoder input → L2 H1.k"


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_edge_patching_equals_a_reference_by_hooks(name):
    handle, clean, corrupted, metric = _pair(name)
    scores = edge_patching(handle, clean, corrupted, metric, edges=EDGES)
    for edge in EDGES:
        expected = float(_reference(name, clean, corrupted, metric, edge))
        assert abs(expected) > 1e-8, edge.label  # the edge carries something
        assert scores[edge] == pytest.approx(expected, rel=1e-8, abs=1e-12), edge.label


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_eap_is_the_slope_of_the_reference(name):
    handle, clean, corrupted, metric = _pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric)
    assert len(scores) == len(graph_edges(handle))
    for edge in EDGES:
        assert scores[edge] == pytest.approx(_slope(name, clean, corrupted, metric, edge), rel=1e-8, abs=1e-12), \
            edge.label


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_one_step_of_eap_ig_is_the_slope_where_both_inputs_enter_halfway(name):
    handle, clean, corrupted, metric = _pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=1)
    for edge in (EDGES[2], EDGES[5]):  # into a cross-attention head's k; from the decoder's input
        slope = _slope(name, clean, corrupted, metric, edge, halfway=True)
        assert scores[edge] == pytest.approx(slope, rel=1e-8, abs=1e-12), edge.label
        assert slope != pytest.approx(_slope(name, clean, corrupted, metric, edge), rel=1e-3)  # the midpoint matters


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_eap_and_eap_ig_rank_the_edges_across_the_streams_as_edge_patching_does(name):
    """Over every edge into a cross-attention head's k and v (from the encoder's input and heads)."""
    handle, clean, corrupted, metric = _pair(name)
    eap = edge_attribution(handle, clean, corrupted, metric)
    ig = edge_attribution(handle, clean, corrupted, metric, method="eap-ig", steps=10)
    across = [e for e in eap.edges if e.role in ("k", "v") and e.receiver[0] in (3, 5)]
    exact = edge_patching(handle, clean, corrupted, metric, edges=across)
    assert len(across) == 2 * 4 * 2 * 9
    assert spearmanr(exact.scores, [eap[e] for e in across]).statistic > 0.9
    assert spearmanr(exact.scores, [ig[e] for e in across]).statistic > 0.9


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_a_circuit_of_every_edge_is_the_clean_run(name):
    handle, clean, corrupted, metric = _pair(name)
    scores = edge_attribution(handle, clean, corrupted, metric)
    assert faithfulness(handle, clean, corrupted, metric, top_edges(scores, k=len(scores))) == pytest.approx(
        1, abs=1e-9)


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_a_circuit_missing_one_edge_is_that_edge_noised(name):
    """Every edge but one: the clean run in which the edge's receiver alone reads the sender's corrupted value — the
    reference with the runs swapped (the other receivers read the clean run's stream, so every sender before the
    receiver sends its clean value)."""
    import numpy as np

    from headlab.circuits.circuit import Circuit

    handle, clean, corrupted, metric = _pair(name)
    every = graph_edges(handle)
    runs = edge_patching(handle, clean, corrupted, metric, edges=every[:1])
    gap = runs.clean_metric - runs.corrupted_metric
    for edge in (EDGES[2], EDGES[4], EDGES[5], EDGES[6]):  # into cross-attention's k, v and q; the decoder's input
        kept = Circuit("", [e for e in every if e != edge], np.zeros(len(every) - 1))
        measured = faithfulness(handle, clean, corrupted, metric, kept) * gap + runs.corrupted_metric
        expected = runs.clean_metric + float(_reference(name, corrupted, clean, metric, edge))
        assert measured == pytest.approx(expected, rel=1e-8, abs=1e-12), edge.label


def test_with_a_shared_target_the_decoder_input_sends_nothing():
    handle, clean, corrupted, metric = _pair("bart", shared_target=True)
    eap = edge_attribution(handle, clean, corrupted, metric)
    exact = edge_patching(handle, clean, corrupted, metric, edges=[e for e in eap.edges if e.sender == DECODER_INPUT])
    assert len(exact) > 0 and not exact.scores.any()
    assert not [eap[e] for e in exact.edges if eap[e]]
    assert eap[EDGES[2]] != 0  # the source's change still reaches the cross-attention's keys


def test_text_pairs_run_through_a_tokenizer(tmp_path):
    """(source, target) text pairs, as the handle takes them (MiniLM's tokenizer beside a BART with a language-model
    head): EAP scores the whole graph, edge patching confirms the sign of its top edges, a logit difference's
    circuit of every edge is the clean run, and a circuit is written with its figure."""
    import transformers

    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    config = FAMILIES["bart"].config()
    config.vocab_size, config.pad_token_id, config.decoder_start_token_id = len(tokenizer), 0, tokenizer.cls_token_id
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration._from_config(config).double().eval()
    handle = headlab.attach(model, tokenizer=tokenizer)
    clean, corrupted = ("The cat sat on the mat.", "A cat sat."), ("The dog sat on the mat.", "A dog sat.")

    def metric(output):
        return (output.logits[:, -1, 5] - output.logits[:, -1, 7]).mean()

    eap = edge_attribution(handle, clean, corrupted, metric)
    assert len(eap) == len(graph_edges(handle))
    exact = edge_patching(handle, clean, corrupted, metric, edges=eap.top(5))
    assert all(eap[e] * score > 0 for e, score in zip(exact.edges, exact.scores))  # the top edges' signs hold
    assert faithfulness(handle, clean, corrupted, metric, top_edges(eap, k=len(eap))) == pytest.approx(1, abs=1e-9)
    written = top_edges(eap, k=10).write(tmp_path / "circuit")  # the figure draws the decoder's input too
    assert [path.suffix for path in written] == [".json", ".csv", ".png", ".svg"]


def test_bad_inputs_and_models_are_refused_in_one_line():
    handle, clean, corrupted, metric = _pair("bart")
    shorter = {**corrupted, "decoder_input_ids": corrupted["decoder_input_ids"][:, :4]}
    with pytest.raises(ValueError, match=r"^clean and corrupted decoder_input_ids must have the same shape .* clean "
                                         r"\(2, 5\), corrupted \(2, 4\)"):
        edge_attribution(handle, clean, shorter, metric)
    clip = headlab.attach(FAMILIES["clip"].build(dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^CLIPModel has several towers \(stacks .*\), .* joined by no "
                                         r"cross-attention: .* attach one tower alone"):
        graph_edges(clip)
