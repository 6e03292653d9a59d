"""Tiny random transformers models and the checks the family adapter tests share."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headlab.interop import export, swap, swapped_modules  # noqa: E402

VOCAB = 100
PAD = 0
SIZES = dict(vocab_size=VOCAB, pad_token_id=PAD)


def config(kind: str, **overrides):
    """A 2-layer config of one family; ``overrides`` replace any field."""
    t = transformers
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **SIZES)
    if kind == "bert":
        return t.BertConfig(**common | overrides)
    if kind == "roberta":
        return t.RobertaConfig(**common | dict(max_position_embeddings=40) | overrides)
    if kind == "xlm-roberta":
        return t.XLMRobertaConfig(**common | dict(max_position_embeddings=40) | overrides)
    if kind == "gpt2":
        return t.GPT2Config(**dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
                                   **SIZES) | overrides)
    decoder = common | dict(bos_token_id=1, eos_token_id=2, max_position_embeddings=64)
    if kind == "llama":  # grouped-query, head_dim set independently, all four biases
        return t.LlamaConfig(**decoder | dict(num_key_value_heads=2, head_dim=12, attention_bias=True) | overrides)
    if kind == "mistral":  # multi-query, a window shorter than the test sequences
        return t.MistralConfig(**decoder | dict(num_key_value_heads=1, sliding_window=4) | overrides)
    if kind == "qwen2":  # q/k/v bias, no o bias; layer 1 slides, layer 0 does not
        return t.Qwen2Config(**decoder | dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1) | overrides)
    raise ValueError(kind)


def build(model_class, cfg, *, attn_implementation: str = "eager", seed: int = 0):
    """A model with every weight random (biases and norms included), in eval mode."""
    torch.manual_seed(seed)
    model = model_class._from_config(cfg, attn_implementation=attn_implementation)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.2)
            if "norm" in name.lower() and name.endswith("weight"):
                p.add_(1.0)
    return model.eval()


def batch(*, padding: str, batch_size: int = 3, length: int = 9, seed: int = 1):
    """``(input_ids, attention_mask)`` with ragged padding on the ``padding`` side ("left" / "right" / "none")."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    for row in range(1, batch_size):
        pad = min(2 * row + 1, length - 2)
        if padding == "left":
            mask[row, :pad] = 0
        elif padding == "right":
            mask[row, length - pad :] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def swapped_copy(model, *, attn_implementation: str):
    """A deep copy of ``model`` running ``attn_implementation``, attention swapped."""
    twin = copy.deepcopy(model)
    twin.set_attn_implementation(attn_implementation)
    return swap(twin)


def first_output(output):
    return output.logits if hasattr(output, "logits") and output.logits is not None else output.last_hidden_state


def max_diff_on_tokens(original, swapped, ids, mask) -> float:
    """max |swapped − original| over the positions that are not padding."""
    with torch.no_grad():
        a = first_output(original(input_ids=ids, attention_mask=mask))
        b = first_output(swapped(input_ids=ids, attention_mask=mask))
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max())


def assert_round_trip(model, *, attn_implementation: str = "sdpa") -> None:
    """swap → export gives back the original state_dict exactly, module classes, and outputs."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    twin = swapped_copy(model, attn_implementation=attn_implementation)
    assert swapped_modules(twin)
    export(twin)
    assert not swapped_modules(twin)
    assert [type(m) for m in twin.modules()] == classes
    restored = twin.state_dict()
    assert restored.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(restored[name], value), name
    ids, mask = batch(padding="right")
    twin.set_attn_implementation(model.config._attn_implementation)
    assert max_diff_on_tokens(model, twin, ids, mask) == 0.0
