"""headlab.load: the packaged MiniLM, local checkpoints, hub ids offline, and clear refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import headlab
from headlab.models import HeadedModel, default_model_path, headed
from tests.support.tiny import batch, build, max_diff_on_tokens

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Heads attend.",
    "Attention heads, one by one, in a small model that runs offline on two cores.",
]


@pytest.fixture(scope="module")
def minilm() -> HeadedModel:
    return headlab.load()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Tiny saved checkpoints: a BERT base model (no tokenizer files) and a GPT-2 causal LM."""
    root = tmp_path_factory.mktemp("checkpoints")
    saved = {}
    for name in ("bert", "gpt2"):
        model = build(name)
        model.save_pretrained(root / name)
        saved[name] = (root / name, model)
    return saved


def test_default_is_the_packaged_minilm(minilm):
    assert Path(minilm.source) == default_model_path().resolve()
    assert (default_model_path() / "model.safetensors").is_file()
    assert minilm.architecture == "BertModel" and not minilm.model.training
    assert minilm.model.config._attn_implementation == "headlab"
    assert minilm.tokenizer is not None
    sites = headed(minilm).sites
    assert [site.layer for site in sites] == list(range(6))
    assert all((site.W_Q.shape, site.n_heads, site.n_kv_heads, site.causal) == ((12, 384, 32), 12, 12, False)
               for site in sites)
    assert [site.out_proj.name for site in sites] == [f"encoder.layer.{i}.attention.output.dense" for i in range(6)]
    assert headed(minilm.model).sites == sites


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
    assert loaded.architecture == "GPT2LMHeadModel" and loaded.tokenizer is None  # no tokenizer files saved
    assert all(site.causal for site in headed(loaded).sites)
    ids, mask = batch(padding="left")
    assert max_diff_on_tokens(original, loaded.model, ids, mask) < 1e-5


@pytest.mark.parametrize("dtype", ["float64", torch.bfloat16])
def test_dtype_and_device(checkpoints, dtype):
    path, _ = checkpoints["bert"]
    loaded = headlab.load(str(path), dtype=dtype, device="cpu")
    expected = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    assert type(loaded.model).__name__ == "BertModel"
    assert {p.dtype for p in loaded.model.parameters()} == {expected}
    ids, mask = batch(padding="right")
    with torch.no_grad():  # the attention runs in that dtype too, patterns included
        out = loaded.model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert out.last_hidden_state.dtype == expected and out.attentions[0].dtype == expected
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


@pytest.mark.parametrize("config, message", [
    (lambda: transformers.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                          intermediate_size=64, architectures=["DebertaV2Model"]),
     r"DebertaV2Model \(model_type 'deberta-v2'\) computes attention outside transformers' AttentionInterface"),
    (lambda: transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=4,
                                      architectures=["BloomForCausalLM"]),
     r"BloomForCausalLM \(model_type 'bloom'\) computes attention outside transformers' AttentionInterface"),
])
def test_unsupported_architecture_is_refused_before_the_weights(tmp_path, config, message):
    target = tmp_path / "ckpt"
    config().save_pretrained(target)
    (target / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ValueError, match=message):
        headlab.load(target)


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"'no-such-org/no-such-model' is not a local directory.*HF_HUB_OFFLINE"):
        headlab.load("no-such-org/no-such-model")


def test_a_hub_that_cannot_be_reached_fails_at_once_from_the_cache(monkeypatch):
    import socket

    import huggingface_hub.constants

    from headlab.models.loading import hub_unreachable

    with socket.socket() as s:  # a port where nothing listens: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert hub_unreachable() == f"127.0.0.1:{port} cannot be reached (Connection refused)"
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"'no-such-org/no-such-model' is not a local directory.*127.0.0.1:{port} "
                                         r"cannot be reached \(Connection refused\), so only the cache was read"):
        headlab.load("no-such-org/no-such-model")
    assert time.monotonic() - start < 5  # not the download's retries (about 30 s)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # the probe would bypass it: not probed
    assert hub_unreachable() is None


def test_attention_sites_refuse_a_model_that_is_not_attached():
    with pytest.raises(ValueError, match="has no headlab attention"):
        _ = headed(build("bert")).sites


def test_a_model_dispatched_by_a_device_map_with_disk_offload_is_attached_as_it_is(tmp_path):
    pytest.importorskip("accelerate")
    from headlab import heads
    from headlab.capture import run_with_cache

    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    plain = headlab.load(tmp_path / "llama")
    places = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "disk",
              "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    dispatched = headlab.load(tmp_path / "llama", device_map=places, offload_folder=tmp_path / "offload")
    assert any(p.device.type == "meta" for p in dispatched.model.parameters())  # layers 1 and 2 wait on disk
    assert len(dispatched.sites) == 3
    with torch.no_grad():
        torch.testing.assert_close(dispatched.model(input_ids=ids).logits, plain.model(input_ids=ids).logits)
        with heads.masked(plain, {2: [1]}), heads.masked(dispatched, {2: [1]}):
            torch.testing.assert_close(dispatched.model(input_ids=ids).logits, plain.model(input_ids=ids).logits)
    mine, theirs = run_with_cache(dispatched, ids), run_with_cache(plain, ids)
    torch.testing.assert_close(mine["blocks.2.attn.pattern"], theirs["blocks.2.attn.pattern"])
    with pytest.raises(ValueError, match=r"device='cpu' and device_map='auto': give one"):
        headlab.load(tmp_path / "llama", device="cpu", device_map="auto")
    with pytest.raises(ValueError, match=r"offload_folder='x' is for a device_map"):
        headlab.load(tmp_path / "llama", offload_folder="x")
