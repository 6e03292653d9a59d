"""Path patching (headlab.circuits.paths) against a hand-written float64 reference and its definition.

- on a GPT-2 (MLPs and norms recomputing), a sender → receiver query path equals the same two runs
  written with transformers hooks: the corrupted run with the sender's z taken from the clean run and
  every other head's z frozen, its receiver's query recorded; then the corrupted run with that query;
- a path to the output is the first run's metric;
- in an attention-only model nothing but heads lies between two heads, so a path is the edge itself:
  path patching equals edge patching;
- noising swaps the runs; bad receivers, senders and directions name what was expected.
"""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab.circuits.edges import edge_patching
from headlab.circuits.graph import OUTPUT, Edge
from headlab.circuits.paths import path_patching
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from tests.support.tiny import build

D_HEAD = 8  # the tiny GPT-2: 2 layers, 4 heads of 8, d_model 32


def _metric(output):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return (logits[:, -1, 5] - logits[:, -1, 7]).mean()


def _inputs():
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(3, 100, (2, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 100, (2,), generator=generator)
    return clean, corrupted


def _reference(sender, receiver, clean, corrupted):
    """Path patching of GPT-2 written with hooks on transformers' own modules (float64, eager attention)."""
    model = build("gpt2", std=0.2).double()
    blocks = model.transformer.h

    def z_of(ids):  # every layer's merged z: the input of each block's c_proj
        seen = {}
        hooks = [b.attn.c_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].clone()))
                 for i, b in enumerate(blocks)]
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        for hook in hooks:
            hook.remove()
        return seen, logits

    (clean_z, _), (base_z, base_logits) = z_of(clean), z_of(corrupted)
    layer_s, head_s = sender
    heads_s = slice(head_s * D_HEAD, (head_s + 1) * D_HEAD)

    def frozen(i):
        def hook(module, args):
            z = base_z[i].clone()
            if i == layer_s:
                z[..., heads_s] = clean_z[i][..., heads_s]
            return (z,)
        return hook

    layer_r, head_r, role = receiver
    columns = slice({"q": 0, "k": 32, "v": 64}[role] + head_r * D_HEAD, {"q": 0, "k": 32, "v": 64}[role]
                    + (head_r + 1) * D_HEAD)
    recorded = {}
    hooks = [b.attn.c_proj.register_forward_pre_hook(frozen(i)) for i, b in enumerate(blocks)]
    hooks.append(blocks[layer_r].attn.c_attn.register_forward_hook(
        lambda m, a, out: recorded.__setitem__("x", out[..., columns].clone())))
    with torch.no_grad():
        model(input_ids=corrupted)
    for hook in hooks:
        hook.remove()

    def replace(module, args, out):
        out = out.clone()
        out[..., columns] = recorded["x"]
        return out

    hook = blocks[layer_r].attn.c_attn.register_forward_hook(replace)
    with torch.no_grad():
        logits = model(input_ids=corrupted).logits
    hook.remove()
    return float(_metric(type("O", (), {"logits": logits}))) - float(_metric(type("O", (), {"logits": base_logits})))


@pytest.mark.parametrize("receiver", [(1, 2, "q"), (1, 0, "k"), (1, 3, "v")])
def test_a_path_equals_a_reference_by_hooks(receiver):
    handle = headlab.attach(build("gpt2", std=0.2).double())
    clean, corrupted = _inputs()
    scores = path_patching(handle, clean, corrupted, _metric, receivers=[receiver], senders=[(0, 1)])
    assert scores[Edge((0, 1), receiver)] == pytest.approx(_reference((0, 1), receiver, clean, corrupted), abs=1e-6)


def test_a_path_to_the_output_is_the_frozen_run():
    """Sender → output: every head but the sender frozen, the metric's change (no second run)."""
    handle = headlab.attach(build("gpt2", std=0.2).double())
    clean, corrupted = _inputs()
    scores = path_patching(handle, clean, corrupted, _metric, receivers=[OUTPUT], senders=[(1, 2), (0, 3)])
    assert scores.forwards == 2 + 2
    # in the last layer nothing but the stream lies after the head: the path is the head's own patch
    exact = headlab.analysis.activation_patching(handle, clean, corrupted, _metric, heads={1: [2]})
    assert scores[Edge((1, 2), OUTPUT)] == pytest.approx(float(exact.table["change"][0]), abs=1e-9)


def test_in_an_attention_only_model_a_path_is_the_edge():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_sizes=[20], n_classes=20, max_len=16,
                            layers=[AttentionConfig(d_model=16, n_heads=4)] * 2).double()
    handle = headlab.attach(model)
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 20, (3, 10), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 5) % 20
    receivers = [(1, h, r) for h in range(4) for r in "qkv"] + [OUTPUT]
    paths = path_patching(handle, clean, corrupted, _metric, receivers=receivers)
    edges = edge_patching(handle, clean, corrupted, _metric, edges=paths.edges)
    assert paths.scores == pytest.approx(edges.scores, abs=1e-10)


def test_noising_patches_the_clean_run():
    handle = headlab.attach(build("gpt2", std=0.2).double())
    clean, corrupted = _inputs()
    noised = path_patching(handle, clean, corrupted, _metric, receivers=[OUTPUT], senders=[(1, 2)], direction="noise")
    exact = headlab.analysis.activation_patching(handle, corrupted, clean, _metric, heads={1: [2]})
    assert noised.scores[0] == pytest.approx(float(exact.table["change"][0]), abs=1e-9)
    assert noised.details == {"direction": "noise"}


def test_bad_arguments_say_what_was_expected():
    handle = headlab.attach(build("gpt2"))
    clean, corrupted = _inputs()
    with pytest.raises(ValueError, match=r"direction='both'; expected one of \('denoise', 'noise'\)"):
        path_patching(handle, clean, corrupted, _metric, receivers=[OUTPUT], direction="both")
    with pytest.raises(ValueError, match=r"receiver \(1, 9, 'q'\): head 9; layer 1 has 4 query heads"):
        path_patching(handle, clean, corrupted, _metric, receivers=[(1, 9, "q")])
    with pytest.raises(ValueError, match=r"receiver \(1, 0, 'z'\); expected 'output' or \(layer, head, role\)"):
        path_patching(handle, clean, corrupted, _metric, receivers=[(1, 0, "z")])
    with pytest.raises(ValueError, match=r"sender \(5, 0\); expected \(layer, head\) of the model"):
        path_patching(handle, clean, corrupted, _metric, receivers=[OUTPUT], senders=[(5, 0)])
    with pytest.raises(ValueError, match=r"no sender is in an earlier layer"):
        path_patching(handle, clean, corrupted, _metric, receivers=[(0, 0, "q")], senders=[(1, 0)])
    with pytest.raises(ValueError, match=r"receivers is empty"):
        path_patching(handle, clean, corrupted, _metric, receivers=[])
