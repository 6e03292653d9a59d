"""A tiny stand-in for a swapped transformers model, and a fast tokenizer built in memory.

Layers have different head counts (4, 4, 2) so that per-layer selections are exercised.
"""

from __future__ import annotations

import string
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from headlab.interop.hf_attention import SwappedAttention
from headlab.layer import AttentionConfig, MultiHeadAttention

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "red"]
HEADS = (4, 4, 2)
D_MODEL = 16


def fake_tokenizer():
    """A BERT-style WordPiece tokenizer: [CLS] … [SEP], words split into characters when unknown."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab_list = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *chars, *[f"##{c}" for c in chars]]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tokenizer


class FakeAttention(SwappedAttention):
    """A residual block around a swapped attention, called with a Hugging Face 4-D bool mask."""

    def forward(self, hidden_states: Tensor, attention_mask: Tensor) -> Tensor:
        return hidden_states + self.attend(hidden_states, attention_mask=attention_mask)


class FakeModel(nn.Module):
    """Embedding, then one ``FakeAttention`` per entry of ``heads``; returns hidden states."""

    def __init__(self, vocab_size: int, *, heads: tuple[int, ...] = HEADS, max_positions: int = 64) -> None:
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=max_positions)
        self.embed = nn.Embedding(vocab_size, D_MODEL)
        self.position = nn.Embedding(max_positions, D_MODEL)
        self.blocks = nn.ModuleList(
            FakeAttention(MultiHeadAttention(AttentionConfig(d_model=D_MODEL, n_heads=h)), i)
            for i, h in enumerate(heads)
        )
        self.forward_calls = 0

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self.forward_calls += 1
        pos = input_ids.shape[1]
        x = self.embed(input_ids) + self.position(torch.arange(pos, device=input_ids.device))
        mask = attention_mask.bool()[:, None, None, :].expand(-1, 1, pos, pos)  # True = attend
        for block in self.blocks:
            x = block(x, mask)
        return x

    def reference(self, ids: list[int]) -> list[dict[str, Tensor]]:
        """One unpadded item, layer by layer: every head's pattern, head output and z, straight
        from each headlab layer's own forward."""
        x = self.embed(torch.tensor([ids])) + self.position(torch.arange(len(ids)))
        out = []
        for block in self.blocks:
            o = block.attn(x, return_patterns=True, return_head_outputs=True, return_z=True)
            out.append({"patterns": o.patterns[0], "head_outputs": o.head_outputs[0], "z": o.z[0]})
            x = x + o.output
        return out
