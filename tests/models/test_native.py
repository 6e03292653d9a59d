"""headlab's own layers behind the same handle as a transformers model: sites, caches, interventions and
patching on a ``MultiHeadAttention`` and on the experiments' ``TinyTransformer``, each checked against the
layer's own ``return_*`` outputs or against the math done by hand."""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab import heads
from headlab.analysis.patching import activation_patching, attribution_patching
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.masks import sink_window_blocked
from headlab.models import HeadedModel, LayerSite, headed

CONFIGS = {
    "wide": AttentionConfig(d_model=16, n_heads=4),
    "grouped": AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, causal=True),
    "rotary": AttentionConfig(d_model=16, n_heads=4, rotary=True, causal=True),
    "narrow": AttentionConfig(d_model=16, n_heads=4, projection="narrow"),
}


def layer_of(name: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(CONFIGS[name]).double().eval()


def tiny() -> TinyTransformer:
    torch.manual_seed(0)
    configs = [AttentionConfig(d_model=16, n_heads=4), AttentionConfig(d_model=16, n_heads=2)]
    return TinyTransformer(vocab_sizes=[11], n_classes=5, max_len=12, layers=configs).double().eval()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_layer_cache_equals_the_layers_own_outputs(name):
    layer = layer_of(name)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    handle = headlab.attach(layer)
    assert isinstance(handle, HeadedModel) and handle.n_heads == [4] and isinstance(handle.sites[0], LayerSite)
    cache = run(handle, x, take=("pattern", "z", "result", "q", "k", "v"), heads={0: [1, 3]})
    own = layer(x, return_pattern=[1, 3], return_z=[1, 3], return_result=[1, 3])
    assert torch.allclose(cache.output, own.output, atol=1e-12)
    for name_, expected in (("pattern", own.pattern), ("z", own.z), ("result", own.result)):
        assert torch.allclose(torch.stack([cache[name_, 0, h] for h in (1, 3)], 1), expected, atol=1e-12), name_
    # q, k and v as the layer's projection makes them (and its rotary positions), each query head's own k and v.
    q, k, v = layer.projection(x, x, x)
    if layer.rotary is not None:
        q, k = layer.rotary(q, offset=0), layer.rotary(k, offset=0)
    kv_of = layer.config.kv_head_of
    for h in (1, 3):
        assert torch.allclose(cache["q", 0, h], q[:, h], atol=1e-12)
        assert torch.allclose(cache["k", 0, h], k[:, kv_of[h]], atol=1e-12)
        assert torch.allclose(cache["v", 0, h], v[:, kv_of[h]], atol=1e-12)


def run(handle, inputs, **kwargs):
    return headlab.run_with_cache(handle, inputs, **kwargs)


def test_return_pattern_and_a_tap_together_each_get_their_heads():
    layer = layer_of("wide")
    headlab.attach(layer)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    every = layer(x, return_pattern=True).pattern
    taken = {}
    site = headed(layer).sites[0]
    site.tap = headlab.models.Tap(sink=lambda layer_, out: taken.update(pattern=out.pattern), pattern=[0, 2])
    try:
        out = layer(x, return_pattern=[3, 0])
    finally:
        site.tap = None
    assert torch.equal(out.pattern, every[:, [3, 0]]) and torch.equal(taken["pattern"], every[:, [0, 2]])


def test_a_tiny_transformers_sites_and_cache():
    model = tiny()
    handle = headlab.attach(model)
    assert handle.n_heads == [4, 2] and [s.name for s in handle.sites] == ["attention.0", "attention.1"]
    inputs = torch.randint(0, 11, (3, 9, 1))
    cache = run(handle, inputs)
    expected = model(inputs, return_pattern=True)
    assert torch.equal(cache.output.logits, expected.logits)
    for layer, pattern in enumerate(expected.pattern):
        assert torch.allclose(cache["pattern", layer], pattern, atol=1e-12)
    assert cache.tokens is None and cache.inputs["inputs"] is inputs


def test_masking_a_native_head_is_the_layers_own_affine_and_its_state_dict_keeps_it():
    layer = layer_of("wide")
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    expected = layer(x, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    handle = headlab.attach(layer)
    with heads.masked(handle, {0: [1]}):
        assert torch.allclose(layer(x), expected, atol=1e-12)
        assert heads.summary(handle) == [{"layer": 0, "head": 1, "scale": 0.0, "shifted": False,
                                          "kind": "zero-ablated"}]
    assert heads.summary(handle) == [] and not bool((layer.head_scale != 1).any())
    heads.mask(handle, {0: [1]})  # persistent: in the layer's buffers, so a fresh layer loads it
    fresh = MultiHeadAttention(CONFIGS["wide"]).double()
    fresh.load_state_dict(layer.state_dict())
    assert torch.allclose(fresh(x), expected, atol=1e-12)


def test_windowed_native_heads_see_only_sinks_and_recent_keys():
    layer = layer_of("rotary")  # causal
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    blocked = sink_window_blocked(10, 10, window=3, sinks=1, causal=True, offset=0)  # (query, key)
    mask = torch.zeros(1, 4, 10, 10, dtype=torch.bool)
    mask[0, 2] = blocked  # head 2 only
    expected = layer(x, attn_mask=mask)
    handle = headlab.attach(layer)
    with heads.windowed(handle, {0: [2]}, window=3, sinks=1):
        got = layer(x)
    assert torch.allclose(got, expected, atol=1e-12) and not torch.allclose(got, layer(x), atol=1e-6)


def test_patching_a_native_head_is_its_z_replaced_before_the_output_projection():
    layer = layer_of("grouped")
    handle = headlab.attach(layer)
    clean, corrupted = (torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(2))
    clean_z = layer(clean, return_z=True).z
    z = layer(corrupted, return_z=True).z.clone()
    z[:, 2] = clean_z[:, 2]
    expected = layer.projection.merge(z)
    with heads.patched(handle, {0: [2]}, run(handle, clean, take="z")):
        assert torch.allclose(layer(corrupted), expected, atol=1e-12)


def test_activation_and_attribution_patching_agree_exactly_on_a_linear_metric():
    # The layer's output is linear in z, so the first-order estimate of AtP is exact for a linear metric.
    layer = layer_of("wide")
    clean, corrupted = (torch.randn(1, 6, 16, dtype=torch.float64) for _ in range(2))
    weight = torch.randn(6, 16, dtype=torch.float64)

    def metric(output):
        return (output * weight).sum()

    handle = headlab.attach(layer)
    exact = activation_patching(handle, clean, corrupted, metric)
    estimate = attribution_patching(handle, clean, corrupted, metric)
    assert exact.table.heads == estimate.table.heads == [(0, h) for h in range(4)]
    assert torch.allclose(torch.tensor(exact.table["change"]), torch.tensor(estimate.table["change"]), atol=1e-10)


def test_native_models_refuse_pruning_and_saving_with_the_way_to_do_it():
    handle = headlab.attach(tiny())
    with pytest.raises(ValueError, match=r"headlab\.heads\.mask"):
        heads.prune(handle, {0: [1]})
    with pytest.raises(ValueError, match="state_dict"):
        heads.save(handle, "unused")


def test_a_module_without_headlab_layers_is_refused():
    with pytest.raises(TypeError, match="PreTrainedModel, a torch module built of headlab layers"):
        headlab.attach(torch.nn.Linear(2, 2))


def test_detach_leaves_the_layers_own_affine():
    layer = layer_of("wide")
    heads.mask(headlab.attach(layer), {0: [0]})
    headlab.detach(layer)
    assert layer.head_scale[0] == 0 and "headlab_site" not in layer.__dict__
    with pytest.raises(ValueError, match="has no headlab attention"):
        headed(layer)


def test_capture_runs_a_tiny_transformer_over_text():
    # A one-field TinyTransformer reads token ids; padded on the right, its causal heads never see the padding.
    from tests.support.text import fake_tokenizer

    tokenizer = fake_tokenizer()
    torch.manual_seed(0)
    model = TinyTransformer(vocab_sizes=[tokenizer.get_vocab_size()], n_classes=3, max_len=32,
                            layers=[AttentionConfig(d_model=16, n_heads=2)] * 2).eval()
    handle = headlab.attach(model, tokenizer=tokenizer)
    texts = ["the cat sat on the mat", "a dog", "the big red dog ran on a mat"]
    kept = {}

    class Keep:
        def update(self, batch):
            for row, index in enumerate(batch.corpus_indices.tolist()):
                n = int(batch.lengths[row])
                kept[index] = [batch.layers[layer].pattern[row, :, :n, :n] for layer in (0, 1)]

    result = headlab.capture.capture(handle, corpus=texts, consumers=[Keep()], progress=False)
    assert result.items == 3 and result.batches == 1 and sorted(kept) == [0, 1, 2]
    for index, text in enumerate(texts):
        ids = torch.tensor([tokenizer.encode(text).ids])
        expected = model(ids, return_pattern=True).pattern  # the item alone, unpadded
        for layer in (0, 1):
            assert torch.allclose(kept[index][layer], expected[layer][0], atol=1e-6)


def test_a_bidirectional_model_without_a_mask_refuses_padded_batches():
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.attn = torch.nn.Embedding(10, 16), MultiHeadAttention(CONFIGS["wide"])

        def forward(self, ids):
            return self.attn(self.embed(ids))

    handle = headlab.attach(Encoder())
    ids = torch.ones(2, 3, dtype=torch.long)
    assert handle.token_batch(ids, torch.ones_like(ids)) == {"ids": ids}
    with pytest.raises(ValueError, match="padding would reach real tokens: run one item per batch"):
        handle.token_batch(ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
    layer = headlab.attach(MultiHeadAttention(CONFIGS["wide"]))  # its forward takes a key_padding_mask
    assert layer.token_batch(ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))["key_padding_mask"].tolist() == [
        [False, False, False], [False, False, True]]
