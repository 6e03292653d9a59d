"""Where heads and the output read the residual stream (headlab.models.stream), found by one forward.

Per architecture: a pre-norm model's layers read the stream at their input norm and its output at the
final norm, before the unembedding (its LM head); a post-norm encoder's layers read it at the norm that
produced their input, and it has no unembedding. ``Stream.hooked`` records the stream at every point and
edits it where asked; a module read in several layers is a point per call (ALBERT). A vision model's input
enters its stream after the patch embedding; a model output by no norm (CLIP's vision tower) is read at its
last layer's output; a model of stages (Swin) is refused.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import headlab
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from headlab.models.stream import stream_of
from tests.support.tiny import ARCHITECTURES, batch, build


def _inputs():
    ids, mask = batch(padding="none", batch_size=2)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_has_its_points(name):
    handle = headlab.attach(build(name))
    stream = stream_of(handle, _inputs())
    assert len(stream.layers) == handle.n_layers
    assert all(point.kind == "norm" for point in stream.layers)
    assert stream.final.kind == "norm"
    if ARCHITECTURES[name].causal:
        assert stream.unembedding is handle.model.get_output_embeddings()
        assert stream.final.module is stream.final_norm
        assert stream.W_U.shape == (handle.model.config.hidden_size if hasattr(handle.model.config, "hidden_size")
                                    else stream.W_U.shape[0], handle.model.config.vocab_size)
        # the layer's own input norm, inside its block
        assert all(point.name.startswith(site.name.rsplit(".", 1)[0].rsplit(".", 1)[0]) for point, site
                   in zip(stream.layers, handle.sites))
    else:
        assert stream.unembedding is None
        with pytest.raises(ValueError, match=r"no unembedding .* load it with its LM head"):
            stream.W_U  # noqa: B018  # the property's refusal is the point


def test_headlab_model_points_are_its_norms():
    model = TinyTransformer(vocab_sizes=[10], n_classes=10, max_len=16,
                            layers=[AttentionConfig(d_model=16, n_heads=2)] * 2)
    handle = headlab.attach(model)
    stream = stream_of(handle, handle.inputs(torch.randint(0, 10, (2, 8))))
    assert [point.module for point in stream.layers] == list(model.norms)
    assert stream.final.module is model.final_norm and stream.unembedding is model.unembed


def test_hooked_records_and_edits_the_stream():
    handle = headlab.attach(build("gpt2").double())
    inputs = _inputs()
    stream = stream_of(handle, inputs)
    seen: dict = {}
    with torch.no_grad(), stream.hooked(record=seen):
        plain = handle.model(**inputs).logits
    assert set(seen) == {0, 1, "final"}
    embeddings = handle.model.transformer.wte(inputs["input_ids"]) + handle.model.transformer.wpe.weight[:9]
    assert torch.allclose(seen[0], embeddings)
    with torch.no_grad(), stream.hooked(final=lambda x: x * 0):
        edited = handle.model(**inputs).logits
    # the final norm of a zero stream is its bias: every position's logits are the same
    assert torch.allclose(edited, edited[:, :1].expand_as(edited)) and not torch.allclose(edited, plain)


def test_a_module_read_in_several_layers_is_a_point_per_call():
    class Shared(nn.Module):  # one norm before both layers
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.layers = nn.ModuleList(headlab.MultiHeadAttention(AttentionConfig(d_model=16, n_heads=2))
                                        for _ in range(2))
            self.out = nn.Linear(16, 5)

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(self.norm(x))
            return self.out(x)

    model = Shared()
    handle = headlab.attach(model)
    x = torch.randn(1, 4, 16)
    stream = stream_of(handle, {"x": x})
    assert [(p.module, p.call) for p in stream.layers] == [(model.norm, 0), (model.norm, 1)]
    assert stream.final.kind == "unembedding" and stream.entry.module is model.norm
    seen: dict = {}
    with torch.no_grad(), stream.hooked(record=seen, layers={1: lambda s: s * 0}):
        edited = model(x)
    assert torch.equal(seen[0], x) and not seen[1].any()  # the second call's stream alone edited
    with torch.no_grad():
        second = model.layers[1](model.norm(torch.zeros_like(x)))
        assert torch.allclose(edited, model.out(x + model.layers[0](model.norm(x)) + second))


def _family_points(name):
    from tests.support.families import FAMILIES

    handle = headlab.attach(FAMILIES[name].build())
    inputs = {"input_ids": torch.randint(3, 90, (1, 6))} if name == "albert" else {
        "pixel_values": torch.randn(1, 3, 16, 16)}
    return handle, inputs, stream_of(handle, inputs)


def test_a_vision_model_enters_its_stream_after_the_patch_embedding():
    handle, inputs, stream = _family_points("vit")
    assert [p.name for p in stream.layers] == ["layers.0.layernorm_before", "layers.1.layernorm_before"]
    assert stream.entry.name == "layers.0" and stream.final.name == "layernorm"  # the first block reads it whole
    seen: dict = {}
    with torch.no_grad(), stream.hooked(entry=lambda s: s * 0, record=seen):
        handle.model(**inputs)
    assert not seen[0].any()  # every later module reads the stream given where it enters


def test_a_model_output_by_no_norm_is_read_at_its_last_layer():
    handle, inputs, stream = _family_points("clip_vision")
    assert stream.final.kind == "output" and stream.final.name == "encoder.layers.1"
    assert stream.final_norm is None and stream.unembedding is None
    with torch.no_grad():
        plain = handle.model(**inputs).last_hidden_state
        seen: dict = {}
        with stream.hooked(final=lambda s: s + 1, record=seen):
            edited = handle.model(**inputs).last_hidden_state
    assert torch.allclose(edited, plain + 1) and torch.allclose(seen["final"], edited)


def test_albert_reads_its_shared_layer_once_per_call():
    _, _, stream = _family_points("albert")
    norm = "encoder.albert_layer_groups.{}.albert_layers.0.full_layer_layer_norm"
    # layer 0 reads the embeddings mapped in; a post-norm layer L > 0 the previous call's normalised output
    assert stream.layers[0].kind == "attention"
    assert [(p.name, p.call) for p in stream.layers[1:]] == [(norm.format(0), 0), (norm.format(0), 1),
                                                             (norm.format(1), 0)]
    assert (stream.final.name, stream.final.call) == (norm.format(1), 1)


def test_a_model_of_stages_is_refused():
    from tests.support.families import FAMILIES

    handle = headlab.attach(FAMILIES["swin"].build())
    with pytest.raises(ValueError, match=r"^SwinModel: its layers read streams of different shapes"):
        stream_of(handle, {"pixel_values": torch.randn(1, 3, 16, 16)})
