"""Where heads and the output read the residual stream (headlab.models.stream), found by one forward.

Per architecture: a pre-norm model's layers read the stream at their input norm and its output at the
final norm, before the unembedding (its LM head); a post-norm encoder's layers read it at the norm that
produced their input, and it has no unembedding. ``Stream.hooked`` records the stream at every point and
edits it where asked; a module read twice in one forward is refused.
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


def test_a_module_read_twice_is_refused():
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

    handle = headlab.attach(Shared())
    with pytest.raises(ValueError, match=r"norm reads the residual stream 2 times in one forward"):
        stream_of(handle, {"x": torch.randn(1, 4, 16)})
