"""The audit of a real model's attention module, running through headlab's attention: the verdict
agrees with what ``attach`` read off the model, and the recovered W_QK is the module's own."""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab.audit import audit
from tests.support.tiny import build

# Attention modules that take the hidden states alone. Rotary ones also take the model's position
# embeddings as an argument, which the audit does not supply (see issue "The audit survives real code").
HIDDEN_STATES_ONLY = ["gpt2", "opt", "gpt_bigcode", "bert", "distilbert"]


@pytest.mark.parametrize("name", HIDDEN_STATES_ONLY)
def test_audit_of_an_attached_module(name: str) -> None:
    site = headlab.attach(build(name)).sites[0]
    result = audit(site.module)
    assert (result.n_heads, result.n_kv_heads, result.d_head, result.causal) == (
        site.n_heads, site.n_kv_heads, site.d_head, site.causal)
    assert result.equivalent.verified
    with torch.no_grad():
        expected = site.QK.AB.double()  # (head, d_model, d_model), before the scaling
    recovered = result.W_QK.double()
    cosine = (recovered * expected).sum(dim=(1, 2)) / (recovered.norm(dim=(1, 2)) * expected.norm(dim=(1, 2)))
    torch.testing.assert_close(cosine, torch.ones_like(cosine), atol=1e-6, rtol=0)  # equal up to the scaling
