"""headlab.load: the packaged MiniLM, local checkpoints, hub ids offline, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import headlab  # noqa: E402
from headlab.models import LoadedModel, attention_layers, attention_modules, default_model_path  # noqa: E402
from tests.interop.hf_models import batch, build, config, max_diff_on_tokens  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Heads attend.",
    "Attention heads, one by one, in a small model that runs offline on two cores.",
]


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    return headlab.load()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Tiny saved checkpoints: a BERT base model (no tokenizer files) and a GPT-2 causal LM."""
    root = tmp_path_factory.mktemp("checkpoints")
    saved = {}
    for name, model_class, kind in (("bert", transformers.BertModel, "bert"),
                                    ("gpt2", transformers.GPT2LMHeadModel, "gpt2")):
        model = build(model_class, config(kind))
        model.save_pretrained(root / name)
        saved[name] = (root / name, model)
    return saved


def test_default_is_the_packaged_minilm(minilm):
    assert Path(minilm.source) == default_model_path().resolve()
    assert (default_model_path() / "model.safetensors").is_file()
    assert minilm.family == "BertConfig"
    assert type(minilm.model).__name__ == "BertModel" and not minilm.model.training
    assert minilm.model.config._attn_implementation == "sdpa"
    assert minilm.tokenizer is not None
    layers = attention_layers(minilm)
    assert [m.layer_index for m in attention_modules(minilm)] == list(range(6))
    assert all((layer.config.d_model, layer.config.n_heads, layer.config.d_head) == (384, 12, 32) for layer in layers)
    assert attention_layers(minilm.model) == layers


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_minilm_outputs_equal_plain_transformers(minilm, attn_implementation):
    reference = transformers.AutoModel.from_pretrained(
        str(default_model_path()), attn_implementation=attn_implementation, use_safetensors=True).eval()
    inputs = minilm.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert not inputs["attention_mask"].all()  # the batch pads
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        got = minilm.model(**inputs).last_hidden_state
    keep = inputs["attention_mask"].bool()
    assert float((got - expected)[keep].abs().max()) < 1e-5


def test_local_causal_lm_checkpoint(checkpoints):
    path, original = checkpoints["gpt2"]
    loaded = headlab.load(path)  # a Path works as well as a str
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"  # config.architectures names a causal LM
    assert loaded.family == "GPT2Config" and loaded.tokenizer is None  # no tokenizer files saved
    ids, mask = batch(padding="left")
    assert max_diff_on_tokens(original, loaded.model, ids, mask) < 1e-5


@pytest.mark.parametrize("dtype", ["float64", torch.bfloat16])
def test_dtype_and_device(checkpoints, dtype):
    path, _ = checkpoints["bert"]
    loaded = headlab.load(str(path), dtype=dtype, device="cpu")
    expected = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    assert type(loaded.model).__name__ == "BertModel"
    assert {layer.projection.dtype for layer in attention_layers(loaded)} == {expected}
    assert next(loaded.model.parameters()).device.type == "cpu"


def test_bad_dtype_is_refused(checkpoints):
    with pytest.raises(ValueError, match="dtype='int8'"):
        headlab.load(checkpoints["bert"][0], dtype="int8")


def _copy_checkpoint(source: Path, target: Path, *, skip: tuple[str, ...] = ()) -> Path:
    target.mkdir()
    for file in source.iterdir():
        if file.name not in skip:
            (target / file.name).write_bytes(file.read_bytes())
    return target


def test_missing_directory(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"{missing}: no such directory"):
        headlab.load(missing)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        headlab.load("./no/such/dir")


def test_a_file_is_not_a_checkpoint(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="expected a checkpoint directory"):
        headlab.load(file)


def test_directory_without_config(checkpoints, tmp_path):
    target = _copy_checkpoint(checkpoints["bert"][0], tmp_path / "ckpt", skip=("config.json",))
    with pytest.raises(FileNotFoundError, match=f"{target}: no config.json"):
        headlab.load(target)


def test_directory_without_weights(checkpoints, tmp_path):
    target = _copy_checkpoint(checkpoints["bert"][0], tmp_path / "ckpt", skip=("model.safetensors",))
    with pytest.raises(FileNotFoundError, match=f"{target}: no weights; expected model.safetensors"):
        headlab.load(target)


def test_pickle_only_weights_are_refused(checkpoints, tmp_path):
    path, model = checkpoints["bert"]
    target = _copy_checkpoint(path, tmp_path / "ckpt", skip=("model.safetensors",))
    torch.save(model.state_dict(), target / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pickle \(pytorch_model.bin\); headlab loads safetensors only"):
        headlab.load(target)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"hidden_size": 32}), "expected a JSON object with a 'model_type'"),
    (json.dumps({"model_type": "no-such-architecture"}), "not a usable transformers config"),
])
def test_corrupt_config(checkpoints, tmp_path, text, message):
    target = _copy_checkpoint(checkpoints["bert"][0], tmp_path / "ckpt")
    (target / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        headlab.load(target)


def test_corrupt_weights(checkpoints, tmp_path):
    target = _copy_checkpoint(checkpoints["bert"][0], tmp_path / "ckpt")
    (target / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(ValueError, match=f"{target}: could not load the weights"):
        headlab.load(target)


def test_unsupported_architecture_is_refused_before_the_weights(tmp_path):
    target = tmp_path / "t5"
    transformers.T5Config(vocab_size=100, d_model=32, num_layers=1, num_heads=4).save_pretrained(target)
    (target / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ValueError, match=r"T5Config \(model_type='t5'\) has no headlab adapter; supported: BertConfig"):
        headlab.load(target)


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="'no-such-org/no-such-model' is not a local directory.*HF_HUB_OFFLINE"):
        headlab.load("no-such-org/no-such-model")


def test_attention_helpers_refuse_a_model_that_is_not_swapped():
    with pytest.raises(ValueError, match="has no headlab attention"):
        attention_modules(build(transformers.BertModel, config("bert")))
