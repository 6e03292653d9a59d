"""Every architecture headlab serves, on tiny random models with padded batches.

Per architecture of ``tests.support.tiny.ARCHITECTURES``: the attached model's outputs equal
transformers' own (eager and SDPA), ``output_attentions`` equals transformers' eager weights,
tapped heads equal an explicit float64 reference, masking removes exactly one head's z,
pruning equals masking, a saved model loads back identical, and greedy generation with the
KV cache is unchanged. Per entry of ``UNSUPPORTED``: a refusal naming the reason, before any
weight is read.

docs/models.md's generated tables are read off the same models the tests build
(``tests.support.regenerate.architecture_tables``; ``make docs`` rewrites them).

Axis legend: patterns ``(batch, head, query_pos, key_pos)``; z ``(batch, head, query_pos,
d_head_v)``; head outputs ``(batch, head, query_pos, d_model)``; token masks ``(batch, pos)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import torch

import headlab
from headlab import heads
from headlab.capture.taps import tapped
from headlab.models import HeadedModel, headed
from headlab.models.site import AttentionSite
from tests.support.regenerate import MODELS, architecture_tables
from tests.support.tiny import (
    ARCHITECTURES,
    PAD,
    UNSUPPORTED,
    auto_class,
    batch,
    build,
    built,
    first_output,
    max_diff_on_tokens,
    tiny_config,
)

CAUSAL = [name for name, arch in ARCHITECTURES.items() if arch.causal]
# two key/value heads for four query heads: pruning a head from a group leaves the groups uneven
GROUPED = [name for name, arch in ARCHITECTURES.items() if arch.config.get("num_key_value_heads") == 2]
REFERENCE = "headlab-test-float64-reference"  # the name the reference_calls fixture registers


def _implementations(name: str) -> list[str]:
    """transformers' implementations to compare with: eager, and SDPA where the class offers it."""
    model_class = auto_class(name)._model_mapping[type(tiny_config(name))]
    return ["eager", "sdpa"] if model_class._supports_sdpa else ["eager"]


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ragged batch padded where the architecture's tokenizers pad: left for causal LMs."""
    return batch(padding="left" if ARCHITECTURES[name].causal else "right")


def _attached(name: str) -> Any:
    return headlab.attach(built(name)).model


def _n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _inputs_of(module: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record the input of every forward of ``module`` while the block lasts."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
    try:
        yield seen
    finally:
        handle.remove()


@pytest.mark.parametrize("name, implementation", [(n, i) for n in ARCHITECTURES for i in _implementations(n)])
def test_outputs_equal_the_original_model(name, implementation):
    ids, mask = _inputs(name)
    assert not mask.all()  # the batch pads
    assert max_diff_on_tokens(built(name, attn_implementation=implementation), _attached(name), ids, mask) < 1e-5


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_output_attentions_equal_transformers_eager_weights(name):
    ids, mask = _inputs(name)
    with torch.no_grad():
        expected = built(name)(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        got = _attached(name)(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert isinstance(got, tuple) and len(got) == len(expected) == tiny_config(name).num_hidden_layers
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()  # neither the query nor the key is padding
    size, length = ids.shape
    for layer, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape == (size, 4, length, length), layer
        assert float((g - e).abs().masked_fill(~real, 0).max()) < 1e-5, layer


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_in_bfloat16_output_attentions_equal_transformers_eager_to_the_bit(name, device):
    # In 16-bit dtypes the order of the scaling matters: scaling the query instead of q kᵀ moved these
    # outputs by up to 0.17, more than bfloat16's rounding (the GPU bench runs bfloat16). On CUDA the
    # softmax runs in bfloat16 (its kernel sums in float32), where transformers casts to float32 and back.
    ids, mask = (x.to(device) for x in _inputs(name))
    with torch.no_grad():
        expected = built(name).to(device, torch.bfloat16)(input_ids=ids, attention_mask=mask, output_attentions=True)
        got = headlab.attach(built(name).to(device, torch.bfloat16))(input_ids=ids, attention_mask=mask,
                                                                     output_attentions=True)
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()
    for layer, (g, e) in enumerate(zip(got.attentions, expected.attentions)):
        assert g.dtype == e.dtype == torch.bfloat16, layer
        assert torch.equal(g.masked_fill(~real, 0), e.masked_fill(~real, 0)), layer
    tokens = mask.bool()
    assert torch.equal(first_output(got)[tokens], first_output(expected)[tokens])


# --- c. tapped heads against an explicit float64 computation --------------------------------------------------------
#
# The reference model is the same tiny model in float64 whose attention is ``reference_calls``'s:
# textbook softmax(q kᵀ · scaling (+ soft-cap) + mask) v in float64, on the query, key and value
# the model's own projections and positions produce, with transformers' eager mask builder. It
# shares nothing with headlab's attention function but the interface's calling convention; each
# head's output is the reference z times the head's columns of the output projection's weight,
# sliced here from the module itself. The reference model's logits are checked against
# transformers' eager model first, so a wrong reference cannot pass; in float32, since
# transformers' own eager path turns padding rows into NaN in float64 (its float32 softmax).

@pytest.fixture(scope="module")
def reference_calls() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Register the reference attention as ``REFERENCE``; each call appends its (pattern, z) to the list returned."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]  # transformers' grouped-query convention: consecutive groups
        key, value = key.repeat_interleave(groups, dim=1).double(), value.repeat_interleave(groups, dim=1).double()
        scores = query.double() @ key.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
        if kwargs.get("softcap") is not None:
            scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
        if attention_mask is not None:
            scores = scores + attention_mask.double()
        pattern = scores.softmax(dim=-1)
        z = pattern @ value
        calls.append((pattern, z))
        return z.transpose(1, 2).contiguous(), pattern

    AttentionInterface.register(REFERENCE, attention)
    AttentionMaskInterface.register(REFERENCE, eager_mask)
    return calls


def _head_columns(module: torch.nn.Module, heads_: list[int], d_head_v: int) -> torch.Tensor:
    """``(heads, d_head_v, d_model)``: the heads' slices of an output projection's weight."""
    from transformers.pytorch_utils import Conv1D

    weight = module.weight.detach()
    weight = weight if isinstance(module, Conv1D) else weight.t()  # (n_heads · d_head_v, d_model)
    return torch.stack([weight[h * d_head_v:(h + 1) * d_head_v] for h in heads_])


@pytest.mark.parametrize("which", ["two heads", "every head"])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_tapped_heads_equal_a_float64_reference(name, which, reference_calls):
    ids, mask = _inputs(name)
    reference = built(name).double()
    reference.set_attn_implementation(REFERENCE)
    model = headlab.attach(built(name).double()).model
    sites = headed(model).sites
    selection = {s.layer: [s.layer % 2, s.layer % 2 + 2] if which == "two heads" else list(range(s.n_heads))
                 for s in sites}
    reference_calls.clear()
    with torch.no_grad():
        with ExitStack() as stack:
            projected = [stack.enter_context(_inputs_of(reference.get_submodule(s.out_proj.name))) for s in sites]
            expected_logits = first_output(reference(input_ids=ids, attention_mask=mask))
        taken = {}
        with tapped(sites, selection, ("pattern", "z", "result"), lambda layer, out: taken.__setitem__(
                layer, out)):
            got_logits = first_output(model(input_ids=ids, attention_mask=mask))
        eager_logits = first_output(built(name)(input_ids=ids, attention_mask=mask))  # float32 (see above)
    real = mask.bool()
    assert float((expected_logits - eager_logits)[real].abs().max()) < 1e-5  # the reference is the model
    assert float((got_logits - expected_logits)[real].abs().max()) < 1e-5
    assert len(reference_calls) == len(sites) == len(taken)
    tolerance = 1e-10
    for site, (pattern, z) in zip(sites, reference_calls):
        hs, out = selection[site.layer], taken[site.layer]
        b, _, q, dv = z.shape
        merged = projected[site.layer][0].view(b, q, site.n_heads, dv)
        assert torch.equal(merged[real], z.transpose(1, 2)[real])  # the reference z is what the model projects
        rows = real[:, None, :, None]
        keys = real[:, None, None, :] & rows
        assert out.pattern.shape == (b, len(hs), q, q) and out.pattern.dtype == torch.float64
        assert float((out.pattern - pattern[:, hs]).abs().masked_fill(~keys, 0).max()) < tolerance
        assert float((out.z - z[:, hs]).abs().masked_fill(~rows, 0).max()) < tolerance
        W_O = _head_columns(reference.get_submodule(site.out_proj.name), hs, dv)
        result = torch.einsum("bhqd,hdm->bhqm", z[:, hs], W_O)
        assert out.result.shape == result.shape
        assert float((out.result - result).abs().masked_fill(~rows, 0).max()) < tolerance


# --- d. masking, e. pruning, f. saving --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHITECTURES)
def test_masking_a_head_removes_exactly_its_z_and_restore_undoes_it(name):
    ids, mask = _inputs(name)
    model = _attached(name)
    site = headed(model).sites[0]
    head, real = 1, mask.bool()
    with torch.no_grad(), _inputs_of(site.out_proj.module) as seen:
        before = first_output(model(input_ids=ids, attention_mask=mask))
        heads.mask(model, [(0, head)])
        masked = first_output(model(input_ids=ids, attention_mask=mask))
        heads.restore(model)
        restored = first_output(model(input_ids=ids, attention_mask=mask))
    z_before, z_masked = (x.view(*x.shape[:2], site.n_heads, site.d_head_v)[real] for x in seen[:2])
    others = [h for h in range(site.n_heads) if h != head]
    assert torch.equal(z_masked[:, head] - z_before[:, head], -z_before[:, head])
    assert z_before[:, head].abs().max() > 0
    assert torch.equal(z_masked[:, others], z_before[:, others])
    assert (masked - before)[real].abs().max() > 1e-4  # the head mattered downstream
    assert torch.equal(restored, before) and heads.summary(model) == []


PRUNED = {0: [1], 1: [2, 3]}  # grouped-query (4 heads, 2 groups): layer 0 keeps half a group, layer 1 loses one


def _expected_drop(site: AttentionSite, removed: list[int]) -> int:
    """Parameters pruning ``removed`` takes out of ``site``: their q rows, the k/v rows of the key/value
    heads no kept head reads, and their columns of the output projection."""
    kept_kv = {site.kv_head_of[h] for h in range(site.n_heads) if h not in removed}
    gone_kv = site.n_kv_heads - len(kept_kv)

    def per_head(role: str) -> int:
        weight, bias = site.layout.weights(role)
        return weight[0].numel() + (0 if bias is None else bias[0].numel())

    return (len(removed) * (per_head("q") + site.W_O[0].numel())
            + gone_kv * (per_head("k") + per_head("v")))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_pruning_equals_masking(name):
    ids, mask = _inputs(name)
    masked = _attached(name)
    heads.mask(masked, PRUNED)
    pruned = _attached(name)
    sites = headed(pruned).sites
    groups = [tuple(s.kv_head_of) for s in sites]
    drop = sum(_expected_drop(sites[layer], removed) for layer, removed in PRUNED.items())
    before = _n_parameters(pruned)

    assert heads.prune(pruned, PRUNED) == {0: [0, 2, 3], 1: [0, 1]}
    assert max_diff_on_tokens(masked, pruned, ids, mask) < 1e-5
    assert before - _n_parameters(pruned) == drop > 0
    for layer, removed in PRUNED.items():
        kept = [h for h in range(4) if h not in removed]
        kv_kept = sorted({groups[layer][h] for h in kept})
        assert sites[layer].n_heads == len(kept) and sites[layer].n_kv_heads == len(kv_kept)
        assert sites[layer].kv_head_of == tuple(kv_kept.index(groups[layer][h]) for h in kept)
        assert sites[layer].W_Q.shape[0] == len(kept) and sites[layer].W_K.shape[0] == len(kv_kept)


@pytest.mark.parametrize("which", ["two heads", "every head"])
@pytest.mark.parametrize("name", GROUPED)
def test_a_pruned_models_tapped_heads_equal_the_masked_models(name, which):
    """After pruning a query head of a group, heads share key/value heads unevenly: every path (the fused kernel
    with a few heads' patterns, the explicit one with every head's) gives each kept head its own key and value."""
    ids, mask = _inputs(name)
    masked, pruned = _attached(name), _attached(name)
    heads.mask(masked, PRUNED)
    heads.prune(pruned, PRUNED)
    sites = headed(pruned).sites
    kept = {layer: [h for h in range(4) if h not in PRUNED.get(layer, [])] for layer in range(len(sites))}
    chosen = {layer: list(range(len(k) if which == "every head" else 2)) for layer, k in kept.items()}
    what = ("pattern", "z", "k", "v")
    taken: dict[str, dict] = {"masked": {}, "pruned": {}}
    with torch.no_grad():
        in_masked = {layer: [kept[layer][i] for i in c] for layer, c in chosen.items()}
        for label, model, selection in (("masked", masked, in_masked), ("pruned", pruned, chosen)):
            with tapped(headed(model).sites, selection, what, taken[label].__setitem__):
                model(input_ids=ids, attention_mask=mask)
    assert not sites[0].uniform_groups  # layer 0 keeps half a group
    real = mask.bool()
    for layer in range(len(sites)):
        for field in what:
            want, got = getattr(taken["masked"][layer], field), getattr(taken["pruned"][layer], field)
            assert got.shape == want.shape, (layer, field)
            rows = real[:, None, :, None]
            assert float((got - want).abs().masked_fill(~rows, 0).max()) < 1e-5, (layer, field)


def test_pruning_covers_partial_and_whole_key_value_groups():
    """The matrix above exercises both grouped-query cases: a group that keeps some of its query
    heads (its key/value head stays, shared unevenly) and a group that loses all of them."""
    partial = whole = False
    for name in ARCHITECTURES:
        sites = headed(_attached(name)).sites
        for layer, removed in PRUNED.items():
            of = sites[layer].kv_head_of
            for group in {of[h] for h in removed}:
                members = [h for h in range(len(of)) if of[h] == group]
                partial |= len(members) > 1 and not set(members) <= set(removed)
                whole |= len(members) > 1 and set(members) <= set(removed)
    assert partial and whole


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_save_and_load_round_trip(name, tmp_path):
    ids, mask = _inputs(name)
    model = _attached(name)
    heads.prune(model, {0: [1]})
    heads.scale(model, [(0, 2), (1, 0)], 0.5)  # layer 0's numbering after pruning: head 2 was head 3
    sites = headed(model).sites
    heads.mean_ablate(model, [(1, 3)], {1: torch.randn(sites[1].n_heads, sites[1].d_head_v)})
    path = heads.save(HeadedModel(model=model, tokenizer=None, source="tiny"), tmp_path / name)

    loaded = headlab.load(path)
    assert loaded.architecture == type(model).__name__
    assert max_diff_on_tokens(model, loaded.model, ids, mask) == 0.0
    assert max_diff_on_tokens(built(name), loaded.model, ids, mask) > 1e-4  # the interventions survived
    again = headed(loaded).sites
    assert [s.head_ids for s in again] == [s.head_ids for s in sites] == [[0, 2, 3], [0, 1, 2, 3]]
    assert [s.kv_head_of for s in again] == [s.kv_head_of for s in sites]
    assert heads.summary(loaded) == heads.summary(model)
    assert {(r["layer"], r["head"], r["kind"]) for r in heads.summary(loaded)} == {
        (0, 2, "scaled"), (1, 0, "scaled"), (1, 3, "mean-ablated")}


# --- g. generation ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CAUSAL)
def test_greedy_generation_with_the_kv_cache(name):
    ids, mask = _inputs(name)
    options = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=PAD)
    model = _attached(name)
    with torch.no_grad():
        tokens = model.generate(ids, **options)
        for implementation in _implementations(name):
            assert torch.equal(tokens, built(name, attn_implementation=implementation).generate(ids, **options))
        seen: list[tuple[int, tuple[int, ...]]] = []
        with tapped(headed(model).sites, {0: [1], 1: [0, 3]}, ("pattern", "z", "result"),
                    lambda layer, out: seen.append((layer, tuple(out.pattern.shape)))):
            assert torch.equal(model.generate(ids, **options), tokens)
    # The prompt once, then one query per new token against the cached keys (a sliding window's cache
    # keeps only its window).
    assert [shape[:3] for layer, shape in seen if layer == 0] == [(3, 1, ids.shape[1])] + [(3, 1, 1)] * 3
    assert [shape[1] for layer, shape in seen if layer == 1] == [2] * 4


# --- unsupported architectures ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", UNSUPPORTED)
def test_attach_refuses_with_the_reason_and_leaves_the_model(name):
    model = build(name)
    with pytest.raises(ValueError, match=UNSUPPORTED[name][1]):
        headlab.attach(model)
    assert model.config._attn_implementation == "eager"
    assert not any(hasattr(module, "headlab_site") for module in model.modules())


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_load_refuses_a_checkpoint_before_reading_its_weights(name, tmp_path):
    model = build(name)
    model.config.architectures = [type(model).__name__]  # as save_pretrained writes it: load picks this class
    model.config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not weights: never read")
    with pytest.raises(ValueError, match=UNSUPPORTED[name][1]) as refused:
        headlab.load(tmp_path)
    assert "could not load the weights" not in str(refused.value)


# --- docs/models.md -------------------------------------------------------------------------------------------------

def test_docs_list_what_the_tests_run():
    MODELS.check(architecture_tables())

