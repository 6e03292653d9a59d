"""``context_heads`` with a head selection and a length: both passes run the selected heads only, on
streaming chunks and copy cases of the length asked (shrunk to the model's position table), the
defaults unchanged without one; a length that cannot hold a needle is refused in one line."""

from __future__ import annotations

import pytest

import headlab
from headlab.analysis.context_heads import QUICK, context_heads, plot_streaming
from headlab.models import HeadedModel
from tests.support.text import word_piece_tokenizer
from tests.support.tiny import build, tiny

pytest.importorskip("transformers")


def _short_llama(positions: int) -> HeadedModel:
    """``tiny("llama")`` with a position table of ``positions``."""
    tok = word_piece_tokenizer()
    model = build("llama", num_key_value_heads=2, max_position_embeddings=positions, vocab_size=len(tok),
                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  attn_implementation="sdpa")
    return HeadedModel(model=headlab.attach(model).model, tokenizer=tok, source="short llama")


def test_a_selection_and_a_length_reach_both_passes(tmp_path):
    context = context_heads(tiny("llama"), heads={1: [0, 1]}, length=40, quick=True)
    assert context.retrieval.table.heads == context.streaming.table.heads == [(1, 0), (1, 1)]
    assert context.streaming.length == 40 and context.streaming.windows == [4, 16]
    needle = QUICK["needle_length"]
    assert (context.needle_length, context.haystack_length) == (needle, 40 - 1 - 2 * needle)  # [CLS] + 2 needles
    assert context.retrieval.steps == QUICK["needles"] * (needle - 1)
    assert plot_streaming(context.streaming, tmp_path / "streaming.png").read_bytes()[:4] == b"\x89PNG"


def test_without_a_length_the_sizes_are_the_quick_ones():
    context = context_heads(tiny("llama"), heads={0: [3]}, quick=True)
    assert context.streaming.length == QUICK["length"] and context.haystack_length == QUICK["haystack_length"]
    assert context.to_dict()["streaming"]["length"] == QUICK["length"]


def test_a_length_beyond_the_position_table_is_shrunk_to_it():
    context = context_heads(_short_llama(48), heads={0: [0]}, length=500, quick=True)
    assert context.streaming.length == 48 and context.haystack_length == 48 - 1 - 2 * QUICK["needle_length"]


def test_an_encoder_needs_no_needle():
    context = context_heads(tiny("bert"), heads={0: [1]}, length=12, quick=True)
    assert context.retrieval is None and context.reason == "it attends both ways"
    assert context.streaming.length == 12 and context.streaming.table.heads == [(0, 1)]


@pytest.mark.parametrize("length, message", [
    (12, r"^length=12 cannot hold a needle of 8 tokens and its copy after a beginning-of-sequence token: "
         r"expected >= 17$"),
    (0, r"^length=0: expected an int >= 1$"),
    (True, r"^length=True: expected an int >= 1$"),
])
def test_a_length_that_cannot_hold_a_needle_is_refused(length, message):
    with pytest.raises(ValueError, match=message):
        context_heads(tiny("llama"), heads={0: [0]}, length=length, quick=True)
