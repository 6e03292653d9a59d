"""A tiny random BERT with headlab's attention attached, and a fast tokenizer built in memory.

Layers have different head counts (4, 4, 2: layer 2 is pruned) so that per-layer selections
are exercised.
"""

from __future__ import annotations

import string

import pytest
import torch
from torch import Tensor, nn

import headlab
from headlab import heads
from headlab.models import headed

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


def tiny_model(vocab_size: int, *, max_positions: int = 64) -> nn.Module:
    """A random 3-layer BERT (d_model 16, 4 heads), attached, layer 2 pruned to 2 heads; counts its forwards."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=D_MODEL, num_hidden_layers=len(HEADS),
                                     num_attention_heads=max(HEADS), intermediate_size=32,
                                     max_position_embeddings=max_positions, pad_token_id=0)
    model = transformers.BertModel(config).eval()
    with torch.no_grad():  # larger than BERT's init, so that patterns are far from uniform
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3).add_(1.0 if "LayerNorm.weight" in name else 0.0)
    headlab.attach(model)
    heads.prune(model, {layer: list(range(n, max(HEADS))) for layer, n in enumerate(HEADS) if n < max(HEADS)})
    model.forward_calls = 0

    def count(module: nn.Module, args: tuple, kwargs: dict) -> None:
        module.forward_calls += 1

    model.register_forward_pre_hook(count, with_kwargs=True)
    return model


def reference(model: nn.Module, ids: list[int]) -> list[dict[str, Tensor]]:
    """One unpadded item, layer by layer: every head's pattern, result and z, in float64.

    Computed apart from taps: the patterns are transformers' ``output_attentions`` of a float64
    copy, z is what its output projections receive (a pre-hook), each head's result z_h W_O[h].
    """
    import copy

    twin = copy.deepcopy(model).double()
    sites = headed(twin).sites
    z: dict[int, Tensor] = {}
    hooks = [site.out_proj.module.register_forward_pre_hook(
        lambda module, args, layer=site.layer: z.__setitem__(layer, args[0][0])) for site in sites]
    try:
        with torch.no_grad():
            out = twin(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for site in sites:
        per_head = z[site.layer].view(len(ids), site.n_heads, site.d_head_v).transpose(0, 1)  # (head, pos, d_head_v)
        result = torch.einsum("hqd,hdm->hqm", per_head, site.W_O.double())
        layers.append({"pattern": out.attentions[site.layer][0].float(), "z": per_head.float(),
                       "result": result.float()})
    return layers


def save_causal_checkpoint(folder, **overrides):
    """Save a random 2-layer GPT-2 (``overrides`` of its config) with the fake tokenizer beside it,
    as a user's checkpoint directory."""
    transformers = pytest.importorskip("transformers")
    from tests.models.tiny import build

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                               eos_token="[SEP]", bos_token="[CLS]")
    build("gpt2", vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
          pad_token_id=tok.pad_token_id, **overrides).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
