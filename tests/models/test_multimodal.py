"""Models of several towers attach with every tower: tiny random CLIP (a text and a vision tower that meet only at the
output), Gemma 3 (a SigLIP vision tower whose pooled features take the places of image tokens in the text) and LLaVA
(a CLIP vision tower and a LLaMA text model, one image token per patch).

The probe feeds every tower its input, so each gets its sites, in call order (the vision tower first: it runs first):
CLIP's text layers are causal and its vision layers not. For each model, on token ids and pixels: with nothing asked
the attached model's outputs equal the plain SDPA model's; ``output_attentions`` (text and vision) equal eager's;
tapped patterns, z and results equal what the model computes (float64); masking a vision head zeroes its z alone;
pruning a vision head and a text head equals masking them; a pruned and masked model saves and loads identical.
CLIP refuses text alone in one line; Gemma 3 runs its text layers on it; a vision tower that does not take one image
per item (Idefics3) is refused in one line.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import headlab
from headlab import heads
from tests.support.families import FAMILIES, IMAGE_TOKEN, TEXT, VISION
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

IMAGE_TOKENS = {"clip": 0, "gemma3": 4, "llava": 16}  # per image: Gemma 3's pooled 2 × 2; LLaVA's patches, CLS dropped
VISION_SITES, TEXT_SITES = [0, 1], [2, 3]  # the vision tower runs first
CAUSAL = [False, False, True, True]


MODELS = ["clip", "gemma3", "llava"]  # tests/support/families.py


def _build(name: str, implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> Any:
    return FAMILIES[name].build(implementation, dtype)


def _inputs(name: str, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Two items: token ids (one image's tokens after the first, where the text has a place for it) and pixels.
    Gemma 3's token types mark the image tokens, which then see each other both ways, as its processor gives them."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, IMAGE_TOKEN, (2, 7), generator=generator)
    image = torch.full((2, IMAGE_TOKENS[name]), IMAGE_TOKEN)
    ids = torch.cat([ids[:, :1], image, ids[:, 1:]], dim=1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "pixel_values": torch.randn(2, 3, 16, 16, generator=generator, dtype=dtype)}
    if name == "gemma3":
        inputs["token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return inputs


def _output(model: Any, name: str, **kwargs: Any) -> Any:
    with torch.no_grad():
        return model(**_inputs(name, model.dtype), **kwargs)


def _main(name: str, output: Any) -> torch.Tensor:
    """What the model computes from both towers: CLIP's image-text logits and embeddings, the others' logits."""
    if name == "clip":
        return torch.cat([output.logits_per_image.flatten(), output.image_embeds.flatten(),
                          output.text_embeds.flatten()])
    return output.logits


def _attentions(name: str, model: Any, **kwargs: Any) -> list[torch.Tensor]:
    """Every layer's attentions in site order: the vision tower's, then the text's (Gemma 3 does not hand
    ``output_attentions`` to its vision tower: that tower's are asked of it directly)."""
    output = _output(model, name, output_attentions=True, **kwargs)
    if name == "clip":
        return [*output.vision_model_output.attentions, *output.text_model_output.attentions]
    if name == "gemma3":
        with torch.no_grad():
            vision = model.model.vision_tower(pixel_values=_inputs(name, model.dtype)["pixel_values"],
                                              output_attentions=True)
        return [*vision.attentions, *output.attentions]
    return [*output.image_outputs.attentions, *output.attentions]


@pytest.mark.parametrize("name", MODELS)
def test_every_tower_gets_its_sites_in_call_order(name):
    handle = headlab.attach(_build(name))
    vision = "vision_model." if name == "clip" else "model.vision_tower."
    text = "text_model." if name == "clip" else "model.language_model."
    assert [s.name.startswith(vision) for s in handle.sites] == [True, True, False, False]
    assert all(handle.sites[layer].name.startswith(text) for layer in TEXT_SITES)
    assert [s.causal for s in handle.sites] == CAUSAL and not any(s.cross for s in handle.sites)
    assert handle.n_heads == [4, 4, 4, 4] and handle.max_length == 64  # the text tower's, not a vision table's


@pytest.mark.parametrize("name", MODELS)
def test_outputs_and_attentions_equal_transformers(name):
    handle = headlab.attach(_build(name))
    torch.testing.assert_close(_main(name, _output(handle.model, name)), _main(name, _output(_build(name), name)),
                               rtol=1e-5, atol=1e-5)
    got, want = _attentions(name, handle.model), _attentions(name, _build(name, "eager"))
    assert len(got) == len(want) == len(handle.sites)
    for ours, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_taps_equal_what_the_model_computes(name):
    """float64: z is the output projection's input, the tapped pattern times v gives it, the results and the
    projection's bias sum to its output; the patterns are eager's attentions, tower by tower."""
    handle = headlab.attach(_build(name, dtype=torch.float64))
    cache = check_taps(handle, _inputs(name, torch.float64))
    want = _attentions(name, _build(name, "eager", torch.float64))
    for site in handle.sites:
        torch.testing.assert_close(cache["pattern", site.layer], want[site.layer], rtol=0, atol=1e-7)


def test_gemma3_image_tokens_see_each_other_both_ways_and_text_only_earlier_keys():
    """The bidirectional block over the image tokens (its token types) is the model's mask, which every path reads:
    an image token sees the image tokens after it; the text layers stay causal for text."""
    handle = headlab.attach(_build("gemma3"))
    cache = headlab.run_with_cache(handle, _inputs("gemma3"), take="pattern", heads={TEXT_SITES[1]: [0]})
    pattern = cache["pattern", TEXT_SITES[1], 0]  # (batch, query_pos, key_pos)
    first, last = 1, IMAGE_TOKENS["gemma3"]  # the image tokens' positions
    assert bool((pattern[:, first, first + 1: last + 1] > 0).all())
    n = pattern.shape[-1]
    later = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)  # a key after its query
    later[first: last + 1, first: last + 1] = False  # the image block
    assert not pattern[:, later].any()


@pytest.mark.parametrize("name", MODELS)
def test_masking_a_vision_head_zeroes_its_z_alone(name):
    handle = headlab.attach(_build(name))
    before = headlab.run_with_cache(handle, _inputs(name), take="z")
    heads.mask(handle, {VISION_SITES[0]: [1]})
    after = headlab.run_with_cache(handle, _inputs(name), take="z")
    assert not after["z", 0][:, 1].any() and torch.equal(after["z", 0][:, [0, 2, 3]], before["z", 0][:, [0, 2, 3]])


@pytest.mark.parametrize("name", MODELS)
def test_pruning_a_vision_and_a_text_head_equals_masking_them(name):
    removed = {VISION_SITES[0]: [1], TEXT_SITES[1]: [2]}
    masked = headlab.attach(_build(name))
    heads.mask(masked, removed)
    pruned = headlab.attach(_build(name))
    heads.prune(pruned, removed)
    assert pruned.n_heads == [3, 4, 4, 3]
    torch.testing.assert_close(_main(name, _output(pruned.model, name)), _main(name, _output(masked.model, name)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_a_pruned_and_masked_model_saves_and_loads_identical(name, tmp_path):
    handle = headlab.attach(_build(name))
    heads.prune(handle, {VISION_SITES[1]: [0], TEXT_SITES[0]: [3]})
    heads.mask(handle, {TEXT_SITES[1]: [1]})
    loaded = headlab.load(heads.save(handle, tmp_path / name))
    assert loaded.architecture == FAMILIES[name].model_class and loaded.n_heads == [4, 3, 3, 4]
    assert torch.equal(_main(name, _output(loaded.model, name)), _main(name, _output(handle.model, name)))


def test_clip_refuses_text_alone_in_one_line_and_takes_every_towers_inputs():
    handle = headlab.attach(_build("clip"))
    with pytest.raises(ValueError, match=r"^CLIPModel needs pixel_values with the text .*pass a dict of input_ids, "
                                         r"attention_mask and pixel_values \(batch, 3, 16, 16\)$"):
        handle.inputs(torch.tensor([[3, 4, 2]]))
    with pytest.raises(ValueError, match=r"^CLIPModel needs pixel_values"):
        handle.token_batch(torch.tensor([[3, 4, 2]]), torch.ones(1, 3, dtype=torch.long))
    kwargs = handle.inputs(_inputs("clip"))
    assert sorted(kwargs) == ["attention_mask", "input_ids", "pixel_values"]


def test_gemma3_on_text_alone_runs_its_text_layers():
    """A model that puts images in its text reads text alone too: its text layers run, its vision tower does not, so
    every head means the text layers' (a capture over a text corpus too); asking for a vision head is an error."""
    from headlab.capture import capture
    from tests.support.text import word_piece_tokenizer

    handle = headlab.attach(_build("gemma3"), tokenizer=word_piece_tokenizer())
    ids = torch.randint(3, IMAGE_TOKEN, (2, 5), generator=torch.Generator().manual_seed(2))
    cache = headlab.run_with_cache(handle, ids, take="pattern", heads={layer: [0] for layer in TEXT_SITES})
    assert cache["pattern", TEXT_SITES[0], 0].shape == (2, 5, 5)
    every = headlab.run_with_cache(handle, ids, take="pattern")
    assert every.keys() == ["text.blocks.0.attn.pattern", "text.blocks.1.attn.pattern"]
    assert capture(handle, corpus=["the cat sat", "a dog ran"], progress=False).layers == {2: [0, 1, 2, 3],
                                                                                           3: [0, 1, 2, 3]}
    with pytest.raises(RuntimeError, match=r"layers \[0\] did not run"):
        headlab.run_with_cache(handle, ids, take="pattern", heads={"vision.blocks.0.attn": [0]})


def test_a_vision_tower_that_does_not_take_one_image_is_refused_in_one_line():
    """Idefics3 takes several images per item ``(batch, images, channels, height, width)``: refused by the part, with
    the tower's own words, and left as it was."""
    config = transformers.Idefics3Config(text_config=TEXT | dict(model_type="llama"), vision_config=VISION,
                                         image_token_id=IMAGE_TOKEN)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    refusal = (r"^Idefics3ForConditionalGeneration: its vision tower \(config.vision_config\) does not run on one "
               r"image \(1, 3, 16, 16\) of its image size \(.+\)")
    with pytest.raises(ValueError, match=refusal) as err:
        headlab.attach(model)
    assert "\n" not in str(err.value) and model.config._attn_implementation == "sdpa"
    assert not any(hasattr(module, "headlab_site") for module in model.modules())


def test_one_tower_of_a_checkpoint_loads_on_its_own(tmp_path):
    """``headlab.load(..., tower=)``: CLIP's text tower as a CLIPTextModel (its own length limit, causal), its vision
    tower as a CLIPVisionModel, each with the checkpoint's weights; a tower it lacks is one line naming those it has."""
    model = _build("clip")
    model.save_pretrained(tmp_path / "clip")
    text, vision = headlab.load(tmp_path / "clip", tower="text"), headlab.load(tmp_path / "clip", tower="vision")
    assert (text.architecture, text.max_length, text.causal) == ("CLIPTextModel", 64, True)
    assert (vision.architecture, vision.causal) == ("CLIPVisionModel", False)
    inputs = _inputs("clip")
    with torch.no_grad():
        torch.testing.assert_close(text.model(input_ids=inputs["input_ids"]).pooler_output,
                                   model.text_model(input_ids=inputs["input_ids"]).pooler_output)
        torch.testing.assert_close(vision.model(pixel_values=inputs["pixel_values"]).pooler_output,
                                   model.vision_model(pixel_values=inputs["pixel_values"]).pooler_output)
    with pytest.raises(ValueError, match=r"tower='audio', but this CLIPConfig has towers 'text', 'vision'"):
        headlab.load(tmp_path / "clip", tower="audio")


def test_the_commands_run_a_model_of_two_towers_on_the_tower_of_their_input(tmp_path):
    """CLIP needs text and pixels in every forward, a command one input: analyze and view read text with its text
    tower and images with its vision tower (``headlab.load(..., tower=)``); Gemma 3 reads text with its text layers."""
    import json

    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.models import default_model_path
    from tests.support.vision import SIZE, write_images

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    processor = transformers.ViTImageProcessor(size={"height": SIZE, "width": SIZE})
    text_config = TEXT | dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    clip = tmp_path / "clip"
    transformers.CLIPModel(transformers.CLIPConfig(text_config=text_config, vision_config=VISION,
                                                   projection_dim=16)).save_pretrained(clip)
    tokenizer.save_pretrained(clip)
    processor.save_pretrained(clip)
    gemma = tmp_path / "gemma3"
    FAMILIES["gemma3"].build().save_pretrained(gemma)
    tokenizer.save_pretrained(gemma)
    result = CliRunner().invoke(app, ["view", str(gemma), "The cat sat.", "--out", str(tmp_path / "view.html")])
    assert result.exit_code == 2 and "beyond the 128 token embeddings of Gemma3ForConditionalGeneration: the " \
        "tokenizer is not the model's" in " ".join(result.output.split()), result.output
    config = FAMILIES["gemma3"].config()
    config.text_config.vocab_size = len(tokenizer)
    transformers.Gemma3ForConditionalGeneration(config).save_pretrained(gemma)
    images = write_images(tmp_path / "images", n=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\nHeads attend to words.\n", encoding="utf-8")
    runs = {"text": ["analyze", str(clip), "--quick", "--no-syntax", "--text", str(corpus)],
            "images": ["analyze", str(clip), "--quick", "--images", str(tmp_path / "images")]}
    for given, command in runs.items():
        result = CliRunner().invoke(app, [*command, "--json", "--out", str(tmp_path / f"out-{given}")])
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout)["heads"]) == 2 * 4  # one tower's layers
    for args in ([str(clip), "The cat sat."], [str(clip), str(images[0])], [str(gemma), "The cat sat."]):
        result = CliRunner().invoke(app, ["view", *args, "--out", str(tmp_path / "view.html")])
        assert result.exit_code == 0, result.output


def test_a_tower_outside_transformers_auto_mapping_loads_by_its_class_name(tmp_path):
    """SigLIP's text tower (SiglipTextConfig) is not in AutoModel's mapping: SiglipTextModel loads it."""
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=TEXT, vision_config=VISION)).eval()
    model.save_pretrained(tmp_path / "siglip")
    text = headlab.load(tmp_path / "siglip", tower="text")
    ids = torch.tensor([[5, 6, 7, 8]])
    assert text.architecture == "SiglipTextModel"
    with torch.no_grad():
        torch.testing.assert_close(text.model(input_ids=ids).pooler_output,
                                   model.text_model(input_ids=ids).pooler_output)
