"""The corpus: layers written the ways people write them, each with the verdict the audit must give.

The layers are in ``headlab.audit.examples`` (the corpus half of ``EXAMPLES``); the layers of
headlab's own variants are checked in test_examples.py.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from headlab.audit import AuditError, audit
from headlab.audit.examples import EXAMPLES
from tests.support.audit import CORPUS


def test_the_corpus_is_at_least_fifteen_examples() -> None:
    assert len(CORPUS) >= 15 and set(CORPUS) <= set(EXAMPLES)


@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_verdict(name: str, example_audits) -> None:
    _, r = example_audits[name]
    e = CORPUS[name]
    assert (r.call, r.batch_first, r.attention_function, r.attention_calls) == (e.call, e.batch_first, e.function,
                                                                               e.attention_calls)
    assert (r.n_heads, r.n_kv_heads, r.kv_sharing, r.layout, r.reads) == (e.n_heads, e.n_kv_heads, e.kv_sharing,
                                                                         e.layout, "wide")
    assert (r.causal, r.standard, r.bilinear_scores, r.linear_output) == (e.causal, e.standard, e.bilinear, e.linear)
    assert r.equivalent.verified == e.verified
    verdict = "\n".join(r.verdict)
    for fragment in e.says:
        assert fragment in verdict, verdict
    assert ("this is standard multi-head attention (Vaswani et al. 2017)" in verdict) == e.standard
    assert (r.evidence.construction_change > 0) == (name == "unseeded_init")
    json.dumps(r.to_dict())


def test_head_modules_and_loops_are_one_layer_reproduced_by_headlab(example_audits) -> None:
    for name in ("head_modules", "head_loop"):
        module, r = example_audits[name]
        x = torch.randn(2, 7, r.d_model, dtype=torch.float64)
        reference = copy.deepcopy(module).double().eval()
        with torch.no_grad():
            torch.testing.assert_close(r.layer(x), reference(x), rtol=0, atol=1e-12)


def test_complex_rotary_is_probed_in_float32_without_losing_the_imaginary_part(example_audits) -> None:
    module, r = example_audits["llama_rotary"]
    assert (r.dtype, r.computed_in, r.evidence.rtol) == ("float64", "float32", 1e-3)
    assert module.freqs_cis.dtype == torch.complex64  # the module handed in is never changed
    assert r.evidence.interception_change <= r.evidence.rtol


def test_masks_and_causal_flags_nn_multihead_attention_users_ask_about(example_audits) -> None:
    o = example_audits["torch_mha"][1].options
    assert (o.masked_row, o.masked_row_scope, o.causal_flag, o.causal_flag_mask) == ("nan", "one query", "is_causal",
                                                                                      "attn_mask")
    assert (o.weights_keyword, o.causal_with_flag, o.causal_with_flag_and_weights) == ("need_weights", True, False)
    o = example_audits["causal_flag"][1].options
    assert (o.causal_flag, o.causal_flag_mask, o.causal_with_flag, o.causal_with_flag_and_weights) == (
        "is_causal", None, True, False)
    assert example_audits["padding_safe"][1].options.masked_row == "no attention"
    assert example_audits["separate_qkv"][1].options.mask is None


def test_the_same_seed_gives_the_same_audit_for_a_deterministic_module(example_audits) -> None:
    for name, (_, r) in example_audits.items():
        if name != "unseeded_init":
            assert r.evidence.construction_change == 0.0, name
            assert not any("two constructions" in line for line in r.verdict), name


class _HalfInside(nn.Module):
    """Computes its scores in float16: the audit cannot hold float64 or float32 tolerances there."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        pattern = torch.softmax((q.half() @ k.half().transpose(-1, -2)).to(x.dtype), dim=-1)
        return pattern @ v


def test_half_precision_inside_the_forward_is_named_with_the_fix() -> None:
    with pytest.raises(AuditError, match=r"computes in float16 inside its forward.*remove the cast") as info:
        audit(_HalfInside())
    assert info.value.kind == "unsupported"
