"""Calling conventions are detected from the running module; failures say what happened."""

from __future__ import annotations

import pytest
import torch

from headlab.audit import AuditError, audit
from headlab.audit.calling import Caller, candidate_widths, detect
from headlab.audit.examples import EinsumHeadsAttention, SeparateProjectionAttention, SliceSharedAttention
from tests.support.layers import (
    Float32Only,
    NoSoftmax,
    Parameterless,
    Raises,
    SelfOnlyQKV,
    TwoAttentions,
    WrongShape,
)


def _detect(module: torch.nn.Module, **kwargs):
    return detect(module.double().eval(), widths=candidate_widths(module), **kwargs)


@pytest.mark.parametrize(("module", "convention", "cross"), [
    (SliceSharedAttention(embed_size=16, heads=2), "vkq", True),
    (SeparateProjectionAttention(d_model=16, n_heads=2), "qkv", True),
    (torch.nn.MultiheadAttention(16, 2, batch_first=True), "qkv", True),
    (EinsumHeadsAttention(d_model=16, n_heads=2, d_head=4), "self", False),
    (SelfOnlyQKV(), "qkv", False),  # takes (q, k, v) but only the same tensor in every slot
])
def test_detected_convention(module, convention: str, cross: bool) -> None:
    found = _detect(module)
    assert (found.caller.convention, found.cross, found.caller.batch_first) == (convention, cross, True)
    assert found.d_model == 16 if not isinstance(module, SelfOnlyQKV) else found.d_model == 8


def test_sequence_first_inputs_are_detected() -> None:
    found = _detect(torch.nn.MultiheadAttention(16, 2))  # batch_first=False
    assert found.caller == Caller("qkv", batch_first=False)
    assert found.caller.signature == "forward(query, key, value) with (pos, batch, d_model) inputs"


def test_candidate_widths_come_from_parameter_shapes_largest_first() -> None:
    assert candidate_widths(SliceSharedAttention(embed_size=16, heads=2)) == [16, 8]
    with pytest.raises(ValueError, match=r"cannot infer d_model.*--d-model"):
        candidate_widths(Parameterless())


def test_a_module_that_raises_gets_its_most_telling_attempt_in_words() -> None:
    with pytest.raises(AuditError) as info:
        _detect(Raises(), inferred=True)
    message = str(info.value)
    assert info.value.kind == "raised"
    assert "forward(x) raised ValueError: boom: this layer is broken" in message
    assert "forward(query, key, value) raised TypeError" not in message  # arguments that did not fit: noise
    assert message.endswith("to fix: if its input width is none of 8, pass it (--d-model N)")


def test_a_module_without_attention() -> None:
    with pytest.raises(AuditError, match="ran but computed no softmax, scaled_dot_product_attention or "
                       "multi_head_attention_forward") as info:
        _detect(NoSoftmax())
    assert info.value.kind == "no-attention"


def test_a_module_with_the_wrong_output_shape() -> None:
    with pytest.raises(AuditError, match=r"forward\(x\) returned shape \(1, 5, 4\); expected \(1, 5, 8\)") as info:
        _detect(WrongShape())
    assert info.value.kind == "wrong-output"


def test_a_module_with_two_attentions() -> None:
    with pytest.raises(AuditError, match="computed 2 attention operations in one forward") as info:
        _detect(TwoAttentions())
    assert info.value.kind == "several-attention"


def test_a_given_convention_is_the_only_one_tried() -> None:
    with pytest.raises(AuditError) as info:
        _detect(SliceSharedAttention(embed_size=16, heads=2), convention="self")
    assert "forward(x) raised TypeError" in str(info.value)
    assert "forward(query, key, value)" not in str(info.value)


def test_parameterless_module_needs_d_model_and_then_audits() -> None:
    with pytest.raises(ValueError, match="pass d_model"):
        audit(Parameterless())
    result = audit(Parameterless(), d_model=6)
    assert (result.n_heads, result.d_model, result.layout, result.qk_ranks, result.ov_ranks) == (
        1, 6, "single-head", [6], [6])
    assert result.equivalent.verified


def test_a_module_that_only_runs_in_float32_is_audited_in_float32() -> None:
    torch.manual_seed(0)
    result = audit(Float32Only())
    assert result.dtype == "float32" and result.evidence.rtol == 1e-3
    assert (result.n_heads, result.d_head, result.reads, result.layout) == (2, 4, "wide", "standard")
    assert result.equivalent.verified


@pytest.mark.parametrize(("kwargs", "error"), [
    (dict(call="kvq"), "call='kvq' is not one of self, qkv, vkq"),
    (dict(d_model=0), "d_model=0 must be a positive int"),
])
def test_bad_arguments(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        audit(NoSoftmax(), **kwargs)
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Module"):
        audit(lambda x: x)


def test_the_audited_module_is_left_as_it_was() -> None:
    module = SeparateProjectionAttention(d_model=16, n_heads=2).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    audit(module)
    assert module.training and module.q_proj.weight.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
