"""Tiny random models of every family beyond the text decoders and encoders of ``tiny.ARCHITECTURES``:
encoder-decoders (text and audio), vision transformers, models of several towers, and a module run in
several layers — one config each, shared by the family's tests and docs/models.md's generated table.

``FAMILIES[name].build(implementation, dtype)`` gives the model, seeded, in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch


def _transformers() -> Any:
    return pytest.importorskip("transformers")


@dataclass(frozen=True)
class Family:
    """One model of a family, as its tests build it.

    Attributes:
        model_class: the transformers class.
        config: a fresh config of it (its tests change some).
        takes: what its forward reads, for people.
        test: the test file that holds it to transformers.
    """

    model_class: str
    config: Callable[[], Any]
    takes: str
    test: str

    def build(self, implementation: str = "sdpa", dtype: torch.dtype = torch.float32, **changes: Any) -> Any:
        """The model with random weights (seed 0), in eval mode; ``changes`` set on its config first."""
        config = self.config()
        for name, value in changes.items():
            setattr(config, name, value)
        torch.manual_seed(0)
        model_class = getattr(_transformers(), self.model_class)
        return model_class._from_config(config, attn_implementation=implementation).to(dtype).eval()


def _config(name: str, **sizes: Any) -> Callable[[], Any]:
    return lambda: getattr(_transformers(), name)(**sizes)


SEQ2SEQ = dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
WHISPER = dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
               max_source_positions=16, max_target_positions=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=0)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16,
              patch_size=4)  # a 4 × 4 grid of patches
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
IMAGE_TOKEN = 100  # the image token of the models of several towers


def _gemma3() -> Any:
    text = TEXT | dict(num_key_value_heads=2, head_dim=8, sliding_window=4)  # a window shorter than the text
    return _transformers().Gemma3Config(text_config=text, vision_config=VISION, mm_tokens_per_image=4,
                                        image_token_id=IMAGE_TOKEN)


def _llava() -> Any:
    transformers = _transformers()
    return transformers.LlavaConfig(text_config=transformers.LlamaConfig(**TEXT, num_key_value_heads=2),
                                    vision_config=transformers.CLIPVisionConfig(**VISION),
                                    image_token_index=IMAGE_TOKEN)


_ED, _AUDIO = "tests/models/test_encoder_decoder.py", "tests/models/test_audio.py"
_VISION, _TOWERS, _SHARED = ("tests/models/test_vision.py", "tests/models/test_multimodal.py",
                             "tests/models/test_shared_layers.py")
FAMILIES = {
    "bart": Family("BartModel", _config("BartConfig", **SEQ2SEQ), "token ids (source, target)", _ED),
    "marian": Family("MarianModel", _config("MarianConfig", **SEQ2SEQ, decoder_start_token_id=0, pad_token_id=1),
                     "token ids (source, target)", _ED),
    "t5": Family("T5Model", _config("T5Config", vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                    num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                    relative_attention_max_distance=16, decoder_start_token_id=0),
                 "token ids (source, target)", _ED),
    "whisper": Family("WhisperModel", _config("WhisperConfig", **WHISPER), "log-mel features, token ids", _AUDIO),
    "vit": Family("ViTModel", _config("ViTConfig", **VISION), "pixels", _VISION),
    "deit": Family("DeiTModel", _config("DeiTConfig", **VISION), "pixels", _VISION),
    "dinov2": Family("Dinov2Model", _config("Dinov2Config", **VISION), "pixels", _VISION),
    "clip_vision": Family("CLIPVisionModel", _config("CLIPVisionConfig", **VISION), "pixels", _VISION),
    "siglip_vision": Family("SiglipVisionModel", _config("SiglipVisionConfig", **VISION), "pixels", _VISION),
    "beit": Family("BeitModel", _config("BeitConfig", **VISION), "pixels", _VISION),
    "swin": Family("SwinModel", _config("SwinConfig", embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2,
                                        image_size=16, patch_size=4), "pixels", _VISION),
    "clip": Family("CLIPModel", lambda: _transformers().CLIPConfig(text_config=TEXT, vision_config=VISION,
                                                                   projection_dim=16),
                   "token ids and pixels", _TOWERS),
    "gemma3": Family("Gemma3ForConditionalGeneration", _gemma3, "token ids and pixels", _TOWERS),
    "llava": Family("LlavaForConditionalGeneration", _llava, "token ids and pixels", _TOWERS),
    "albert": Family("AlbertModel", _config("AlbertConfig", vocab_size=100, embedding_size=16, hidden_size=32,
                                            num_hidden_layers=4, num_hidden_groups=2, num_attention_heads=4,
                                            intermediate_size=64, max_position_embeddings=64),
                     "token ids", _SHARED),
}
