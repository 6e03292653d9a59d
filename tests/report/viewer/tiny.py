"""Tiny random BERT and GPT-2 ``HeadedModel``s for the viewer tests (no download, built in memory)."""

from __future__ import annotations

import functools

import pytest

from tests.capture.tiny_model import fake_tokenizer

POSITIONS = 2100  # room for the 2,000-token check


@functools.cache
def _tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                                unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                                bos_token="[CLS]", eos_token="[SEP]")


@functools.cache
def tiny(kind: str, *, layers: int = 2, heads: int = 4):
    """A ``HeadedModel`` of a random 2-layer ``kind`` ("bert": bidirectional, "gpt2": causal)."""
    pytest.importorskip("transformers")
    import headlab
    from headlab.models import HeadedModel
    from tests.models.tiny import build

    tok = _tokenizer()
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if kind == "bert":
        model = build("bert", num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=POSITIONS,
                      attn_implementation="sdpa", **ids)
    elif kind == "gpt2":
        model = build("gpt2", n_layer=layers, n_head=heads, n_positions=POSITIONS, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, attn_implementation="sdpa", **ids)
    else:
        raise ValueError(kind)
    return HeadedModel(model=headlab.attach(model).model, tokenizer=tok, source=f"tiny random {kind}")
