"""``HeadedModel``: a model with attention heads, as headlab works on it — the one handle every
public function takes.

``headlab.load(...)`` and ``headlab.attach(model)`` return it. It holds the model itself (a
transformers model, or a torch module built of headlab layers: still usable as it is), its
tokenizer, where it came from, and its attention sites, with the operations every caller needs:

    loaded = headlab.load()                       # the packaged MiniLM
    loaded.sites[2]                               # layer 2's AttentionSite (heads, gates, tap, weights)
    loaded.n_heads                                # [12, 12, 12, 12, 12, 12]
    loaded.heads({2: [3]})                        # a head selection resolved: {2: [3]}
    inputs = loaded.inputs("The cat sat.")        # keyword arguments of a forward, on the model's device
    with loaded.running(grad=False):              # eval mode, restored afterwards (also on error)
        output = loaded(**inputs)

A function given an attached model instead of its handle wraps it with ``headed(model)``, the one
place where that happens: the model's own handle (the one ``attach`` made, tokenizer included)
when it has one.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast, overload

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.layer.selection import Heads, HeadSelection, resolve
from headlab.models import audio, images, multimodal, seq2seq
from headlab.models.interface import IMPLEMENTATION
from headlab.models.site import AttentionSite, is_attached, sites_of
from headlab.models.truncation import TruncationWarning, truncation_message

HANDLE_ATTRIBUTE = "headlab_handle"  # on an attached model: the handle ``attach`` made for it
Inputs = (str | Sequence[str] | seq2seq.Pair | Sequence[seq2seq.Pair] | Mapping[str, Any] | Tensor | audio.Audio
          | images.Images)  # what ``HeadedModel.inputs`` takes


class HeadedModel(display.Shown):
    """A model with headlab's attention attached, its tokenizer and its attention sites.

    Args:
        model: an attached model (``headlab.attach``): a transformers model, or a torch module built of
            headlab layers.
        tokenizer: its tokenizer (or processor), or None.
        source: the directory or hub id it was loaded from, or "in memory".

    Raises:
        ValueError: ``model`` is not attached.
    """

    def __init__(self, model: nn.Module, *, tokenizer: Any = None,
                 source: str | os.PathLike[str] = "in memory") -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected a torch module with headlab's attention attached, got {type(model).__name__}")
        self.model = model
        self.tokenizer = tokenizer
        self.source = os.fspath(source)
        self._transformers = hasattr(getattr(model, "config", None), "_attn_implementation")
        self._read_sites()

    def _read_sites(self) -> None:
        """Take the sites attached to the model's modules now (``attach`` calls it again after re-attaching)."""
        self._sites = sites_of(self.model)
        if not self._sites:
            raise ValueError(f"{type(self.model).__name__} has no headlab attention: load it with headlab.load(...) "
                             "or call headlab.attach(model)")

    # --- what it is ---
    @property
    def sites(self) -> list[AttentionSite]:
        """The attention sites, in layer order (the order the attention modules run).

        Raises:
            ValueError: the model was detached, or (a transformers model) its attention implementation
                was changed since it was attached: its taps and gates would silently do nothing.
        """
        if not is_attached(self._sites[0]):
            raise ValueError(f"{self.architecture} was detached from headlab: call headlab.attach(model) again")
        config: Any = self.model.config if self._transformers else None  # a transformers PretrainedConfig
        if config is not None and config._attn_implementation != IMPLEMENTATION:
            raise ValueError(f"{self.architecture} runs attn_implementation="
                             f"{config._attn_implementation!r} now, not headlab's: call "
                             "headlab.attach(model) again")
        return self._sites

    @property
    def n_heads(self) -> list[int]:
        """Each layer's (query) heads now, in layer order."""
        return [site.n_heads for site in self.sites]

    @property
    def n_layers(self) -> int:
        """Attention layers (sites)."""
        return len(self._sites)

    @property
    def architecture(self) -> str:
        """The model's class name, e.g. ``"BertModel"``."""
        return type(self.model).__name__

    @property
    def causal(self) -> bool:
        """Whether every layer is causal (a query never sees a later key)."""
        return all(site.causal for site in self.sites)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are (the CPU for a model without any)."""
        parameter = next(self.model.parameters(), None)
        return parameter.device if parameter is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's first floating parameter (float32 for a model without any)."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)

    @property
    def max_length(self) -> int | None:
        """The longest input the model takes, in tokens (``model_max_length``); None when nothing says."""
        return model_max_length(self.model, self.tokenizer)

    # --- what every caller does with it ---
    def heads(self, selection: HeadSelection = None, *, inputs: Mapping[str, Any] | None = None
              ) -> dict[int, list[int]]:
        """A head selection resolved against this model (``headlab.layer.selection.resolve``).

        Args:
            selection: the selection; None (or ``Heads`` of every layer) for every head — of the layers that
                ``inputs`` run, when given: a model of several towers given text alone (no ``pixel_values``)
                runs no vision tower's layer.
            inputs: the keyword arguments of the forward the selection is for (``inputs``), or None.

        Returns:
            ``{layer: sorted unique heads}``.

        Raises:
            TypeError / ValueError: a malformed selection, or a layer or head the model does not have.
        """
        sites = self.sites
        every_layer = selection is None or (isinstance(selection, Heads) and selection.layers is None)
        if (every_layer and inputs is not None and "pixel_values" not in inputs
                and multimodal.vision_config(self.model) is not None):
            selection = Heads(layers=[site.layer for site in sites if site.stack != "vision"],
                              heads=None if selection is None else cast(Heads, selection).heads)
        return resolve(selection, [site.n_heads for site in sites], [site.address for site in sites])

    def inputs(self, inputs: Inputs) -> dict[str, Any]:
        """The keyword arguments of a forward, on the model's device.

        Args:
            inputs: a text or texts (tokenized with padding); the keyword arguments of a forward (a
                mapping); or a tensor: input ids ``(batch, pos)`` for a transformers model (pixel values
                ``(batch, channels, height, width)`` for an image model, whose ``main_input_name`` says
                so), the first argument of its ``forward`` for a headlab model. For a model that takes log-mel
                features (``main_input_name == "input_features"``: Whisper): features, a float tensor
                ``(batch, n_mels, frames)``; or audio, turned into features by the feature extractor the handle
                holds (``tokenizer``: a processor or feature extractor): a 1-D float array or tensor of samples
                at its sampling rate, the path of a 16-bit PCM WAV file (stereo averaged to mono), or a list of
                them. An encoder-decoder also takes ``(source, target)`` text pairs, or a list of them; given no
                decoder input (``decoder_input_ids``, ``decoder_inputs_embeds`` or ``labels`` in a mapping), its
                decoder reads the source shifted right behind ``config.decoder_start_token_id``, or (audio) that
                token alone (``headlab.models.seq2seq``). A model of
                several towers takes a mapping with every tower's input (``input_ids`` and ``pixel_values``); one
                that puts images in its text (Gemma 3, LLaVA) also takes text alone, which runs its text tower only.

        Raises:
            TypeError: inputs of another type, texts without a tokenizer, audio without a feature extractor, or
                images without an image processor.
            ValueError: an empty text, input ids that are not an integer ``(batch, pos)`` tensor, features not of
                the shape the model requires, a WAV file at another sampling rate than the feature extractor's, or
                text alone for a model whose every forward needs pixel values too (CLIP).

        Warns:
            TruncationWarning: texts longer than the model's limit (``max_length``), cut to it.
        """
        kwargs = self._arguments(inputs)
        return seq2seq.with_decoder(self.model, kwargs) if self._transformers else kwargs

    def _arguments(self, inputs: Inputs) -> dict[str, Any]:
        """``inputs``' keyword arguments (``inputs``), an encoder-decoder's decoder inputs left to the caller."""
        device = self.device
        if self._transformers and not isinstance(inputs, Mapping) and multimodal.needs_pixels(self.model):
            raise ValueError(multimodal.pixels_needed(self.model))
        if self._transformers and audio.takes_features(self.model):
            return self._features(inputs)
        if self._transformers and seq2seq.takes_decoder_ids(self.model) and seq2seq.is_pairs(inputs):
            pairs = [inputs] if isinstance(inputs, tuple) else cast(list[tuple[str, str]], inputs)
            source = self._encode([s for s, _ in pairs])
            target = self._encode([t for _, t in pairs], target=True)
            return source | seq2seq.shifted(self.model, target["input_ids"], target["attention_mask"])
        if self._transformers and images.takes_pixels(self.model) and images.is_images(inputs):
            processor = images.image_processor(self.tokenizer, architecture=self.architecture, source=self.source)
            return {images.PIXELS: images.pixel_values(inputs, processor).to(device=device, dtype=self.dtype)}
        if isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs
                                       and all(isinstance(t, str) for t in inputs)):
            return self._encode([inputs] if isinstance(inputs, str) else cast(list[str], list(inputs)))
        if isinstance(inputs, Tensor):
            if not self._transformers:
                return {_first_argument(self.model): inputs.to(device)}
            if getattr(self.model, "main_input_name", "input_ids") == "pixel_values":  # an image model
                if inputs.dim() != 4 or not inputs.is_floating_point():
                    raise ValueError(f"pixel values must be a float tensor (batch, channels, height, width); got "
                                     f"{inputs.dtype} {tuple(inputs.shape)}")
                return {"pixel_values": inputs.to(device=device, dtype=self.dtype)}
            if inputs.dim() != 2 or inputs.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"input ids must be an integer tensor (batch, pos); got {inputs.dtype} "
                                 f"{tuple(inputs.shape)}")
            return {"input_ids": inputs.to(device)}
        if isinstance(inputs, Mapping) and inputs:
            return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}
        raise TypeError(f"inputs must be a text, a list of texts, a tensor or a dict of a forward's arguments; got "
                        f"{type(inputs).__name__}")

    def _encode(self, texts: list[str], *, target: bool = False) -> dict[str, Tensor]:
        """``input_ids`` and ``attention_mask`` of ``texts`` (an encoder-decoder's targets: ``target``), padded, on
        the model's device; texts over the model's limit cut to it, with a ``TruncationWarning``."""
        if self.tokenizer is None:
            raise TypeError(f"text inputs need a tokenizer, and this {self.architecture} has none: "
                            "headlab.attach(model, tokenizer=...) gives it one")
        if any(not t.strip() for t in texts):
            raise ValueError("an input text is empty or whitespace only")
        limit = self.max_length  # transformers' own warning of a text over it is said below, and acted on
        given = {"text_target" if target else "text": texts}
        encoded = self.tokenizer(**given, padding=True, return_tensors="pt", verbose=limit is None)
        if limit is not None and encoded["input_ids"].shape[1] > limit:  # cut to the limit, as every entry is
            lengths = encoded["attention_mask"].sum(dim=1).tolist()
            warnings.warn(truncation_message([i for i, n in enumerate(lengths) if n > limit], len(texts), limit),
                          TruncationWarning, stacklevel=4)
            encoded = self.tokenizer(**given, padding=True, truncation=True, max_length=limit, return_tensors="pt")
        self._check_vocabulary(encoded["input_ids"])
        return {k: v.to(self.device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}

    def _check_vocabulary(self, input_ids: Tensor) -> None:
        """Raise ValueError if the tokenizer gave an id beyond the model's token embeddings (not its tokenizer)."""
        embedding = token_embedding(self.model) if self._transformers else None
        vocabulary = getattr(embedding, "num_embeddings", None)
        if isinstance(vocabulary, int) and input_ids.numel() and int(input_ids.max()) >= vocabulary:
            raise ValueError(f"the tokenizer gives token id {int(input_ids.max())}, beyond the {vocabulary:,} token "
                             f"embeddings of {self.architecture}: the tokenizer is not the model's")

    def _features(self, inputs: Inputs) -> dict[str, Any]:
        """The keyword arguments of a forward of a model that takes log-mel features (``inputs``), on its device."""
        if isinstance(inputs, Mapping) and inputs:
            return {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in inputs.items()}
        shape = audio.feature_shape(self.model)
        if isinstance(inputs, Tensor) and inputs.dim() != 1:  # features; 1-D: samples
            features = audio.check_features(inputs, shape)
        elif isinstance(inputs, (str, os.PathLike, Tensor, np.ndarray)) or (isinstance(inputs, Sequence) and inputs):
            extractor = audio.feature_extractor(self.tokenizer, architecture=self.architecture, source=self.source)
            features = audio.audio_features(cast(audio.Audio, inputs), extractor, shape)  # checked in it
        else:
            raise TypeError(f"inputs of {self.architecture} must be input features, audio samples, a WAV path, a list "
                            f"of them or a dict of a forward's arguments; got {type(inputs).__name__}")
        return {audio.FEATURES: features.to(device=self.device, dtype=self.dtype)}

    def token_batch(self, input_ids: Tensor, attention_mask: Tensor) -> dict[str, Any]:
        """The keyword arguments of a forward on a right-padded batch of token ids (``capture``'s batches).

        A transformers model takes both (an encoder-decoder's decoder reads the ids shifted:
        ``headlab.models.seq2seq``). A headlab model takes the ids as its forward's ``input_ids``, else
        as its first argument, and the mask as its ``attention_mask`` or (True = padding)
        ``key_padding_mask`` when its forward has one; without either, a causal model's real tokens never
        see the padding after them, and a bidirectional one's would.

        Args:
            input_ids: ``(batch, pos)`` on the model's device.
            attention_mask: ``(batch, pos)``, 1 for real tokens.

        Raises:
            ValueError: a padded batch for a bidirectional headlab model whose forward takes no mask, a model
                whose every forward needs pixel values with the ids (CLIP), or an id beyond its token embeddings.
        """
        if self._transformers:
            if multimodal.needs_pixels(self.model):
                raise ValueError(multimodal.pixels_needed(self.model))
            self._check_vocabulary(input_ids)
            return seq2seq.with_decoder(self.model, {"input_ids": input_ids, "attention_mask": attention_mask})
        names = set(inspect.signature(self.model.forward).parameters)
        kwargs = {"input_ids" if "input_ids" in names else _first_argument(self.model): input_ids}
        if "attention_mask" in names:
            kwargs["attention_mask"] = attention_mask
        elif "key_padding_mask" in names:
            kwargs["key_padding_mask"] = attention_mask == 0
        elif not self.causal and not bool(attention_mask.all()):
            raise ValueError(f"{self.architecture}.forward takes no attention mask and its attention sees both "
                             "ways, so padding would reach real tokens: run one item per batch (max_batch_size=1)")
        return kwargs

    def tokens(self, inputs: Mapping[str, Any]) -> list[list[str]] | None:
        """Each item's tokens as strings (padding left out), or None without a tokenizer or input ids.

        Args:
            inputs: keyword arguments of a forward (``inputs``).
        """
        ids = inputs.get("input_ids")
        if self.tokenizer is None or not isinstance(ids, Tensor) or ids.dim() != 2:
            return None
        ids = ids.cpu()
        mask = inputs.get("attention_mask")
        keep = mask.cpu().bool() if isinstance(mask, Tensor) else torch.ones_like(ids, dtype=torch.bool)
        return [self.tokenizer.convert_ids_to_tokens(row[real].tolist()) for row, real in zip(ids, keep)]

    @overload
    def labels(self, inputs: Mapping[str, Any], *, layer: None = None) -> list[list[str]] | None: ...

    @overload
    def labels(self, inputs: Mapping[str, Any], *, layer: int) -> list[tuple[list[str], list[str]]] | None: ...

    def labels(self, inputs: Mapping[str, Any], *, layer: int | None = None) -> Any:
        """Each item's positions as a person reads them: its tokens (``tokens``); for an image model ``[CLS]``,
        ``reg 0``, ``patch r3c7`` (``headlab.models.images.grid_of``; one forward counts the positions; a windowed
        model's, Swin's, on its first stage's grid); for an audio model (Whisper) its encoder's frames, ``frame 0.42
        s`` (``headlab.models.audio.Timeline``).

        Given a ``layer``, the labels of that site's pattern axes: for an audio encoder-decoder by the site's kind
        (``headlab.models.audio.site_axes``): the encoder's self-attention frames × frames, the decoder's
        self-attention tokens × tokens, cross-attention tokens × frames (the decoder's tokens by the processor's
        tokenizer, else ``tok {id}``); for a windowed image model the patches of that layer's stage grid both ways
        (its patterns, per window as the model computes them, laid on that grid by
        ``headlab.models.windows.Windows.scatter``, as the image capture does); for any other model its positions both
        ways.

        Args:
            inputs: keyword arguments of a forward (``inputs``).
            layer: a site's layer index, or None.

        Returns:
            Per item its labels; given a ``layer``, per item ``(query labels, key labels)``. None for a model
            without a tokenizer or input ids.

        Raises:
            ValueError: a layer the model does not have; a decoder site of an audio model whose ``inputs`` have no
                ``decoder_input_ids``; an image model whose config has no ``patch_size``, or whose positions fit no
                grid of patches.
        """
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)
                                  or not 0 <= layer < self.n_layers):
            raise ValueError(f"layer={layer!r}; expected a layer of {self.architecture}, 0 to {self.n_layers - 1}")
        if self._transformers and audio.takes_features(self.model):
            axes = audio.axis_labels(self.model, self.tokenizer, inputs)
            if layer is None:
                return axes[audio.FRAMES]
            query, key = audio.site_axes(self.sites[layer])
            if audio.TOKENS not in axes and audio.TOKENS in (query, key):
                raise ValueError(f"layer {layer} is its decoder's and the inputs have no decoder_input_ids; expected "
                                 "the inputs of a forward (HeadedModel.inputs gives the decoder its start token)")
            return [(queries, keys) for queries, keys in zip(axes[query], axes[key])]
        pixels = inputs.get(images.PIXELS)
        labels: list[list[str]] | None
        if self._transformers and isinstance(pixels, Tensor) and pixels.dim() == 4:
            with self.running(grad=False):
                grid = images.grid_of(self.model, self.sites, pixels)
            if layer is not None:  # a windowed layer's own stage grid
                own = grid.of(layer).labels()
                return [(list(own), list(own)) for _ in range(len(pixels))]
            labels = [grid.labels() for _ in range(len(pixels))]
        else:
            labels = self.tokens(inputs)
        return labels if layer is None or labels is None else [(list(item), list(item)) for item in labels]

    @contextmanager
    def running(self, *, grad: bool | None = None) -> Iterator[nn.Module]:
        """The model in eval mode for the block, its mode restored afterwards (also on error).

        Args:
            grad: True runs with autograd, False without; None leaves it as it is.

        Yields:
            The model.
        """
        with evaluating(self.model, grad=grad):
            yield self.model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward."""
        return self.model(*args, **kwargs)

    # --- how it shows (display.Shown: repr and a notebook's HTML) ---
    def _parts(self) -> list[str]:
        rows = [[site.layer, site.name or "(the layer)", site.n_heads, site.n_kv_heads, site.d_head,
                 "yes" if site.causal else "no", _interventions(site)] for site in self._sites]
        return [display.table(["layer", "module", "heads", "kv heads", "d_head", "causal", "interventions"], rows)]

    def _title(self) -> str:
        heads = [site.n_heads for site in self._sites]
        shape = (f"{len(heads)} layers × {heads[0]} heads" if len(set(heads)) == 1
                 else f"{len(heads)} layers, {sum(heads)} heads")
        return f"HeadedModel: {self.architecture}, {shape}"

    def _facts(self) -> list[tuple[str, object]]:
        changed = [f"L{site.layer} {what}" for site in self._sites if (what := _interventions(site))]
        return [("source", self.source), ("on", f"{self.device}, {str(self.dtype).removeprefix('torch.')}"),
                ("tokenizer", type(self.tokenizer).__name__ if self.tokenizer is not None else "none"),
                ("interventions", "; ".join(changed) or "none")]


@contextmanager
def evaluating(module: nn.Module, *, grad: bool | None = None) -> Iterator[None]:
    """``module`` in eval mode for the block, its mode restored afterwards (also on error): the one such block
    of headlab (``HeadedModel.running``; the probe of ``attach``, before a handle exists; the experiments).

    Args:
        module: any torch module.
        grad: True runs with autograd, False without; None leaves it as it is.
    """
    was_training = module.training
    switch = any(m.training for m in module.modules())  # a model already in eval mode is left alone (a walk less)
    if switch:
        module.eval()
    try:
        if grad is None:
            yield
        else:
            with torch.set_grad_enabled(grad):
                yield
    finally:
        if switch:
            module.train(was_training)


def module_of(model: HeadedModel | nn.Module) -> nn.Module:
    """The model itself, from its handle or as it is (for ``attach`` and ``detach``, which take either)."""
    return model.model if isinstance(model, HeadedModel) else model


def headed(model: HeadedModel | nn.Module) -> HeadedModel:
    """The handle of ``model``: itself if it is one, else the handle ``attach`` made for the model (its
    tokenizer included), else a new handle without a tokenizer. The one place a model is wrapped.

    Raises:
        TypeError: not a torch module or handle.
        ValueError: a model headlab is not attached to.
    """
    if isinstance(model, HeadedModel):
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a HeadedModel (headlab.load / headlab.attach) or an attached model, got "
                        f"{type(model).__name__}")
    handle = model.__dict__.get(HANDLE_ATTRIBUTE)
    return handle if isinstance(handle, HeadedModel) else HeadedModel(model)


def given_tokenizer(model: HeadedModel | nn.Module, tokenizer: Any, where: str, *, depth: int = 1) -> HeadedModel:
    """``headed(model)``, with the tokenizer a caller still passes on its own (deprecated: the handle holds it).

    Args:
        model: as ``headed`` takes it.
        tokenizer: what the caller passed as ``tokenizer=``, or None.
        where: the caller's name, for the warning.
        depth: calls between the user's call and this one's caller (the warning names the user's line).
    """
    handle = headed(model)
    if tokenizer is None or tokenizer is handle.tokenizer:
        return handle
    warnings.warn(f"{where}(tokenizer=...) is deprecated: the model's handle holds its tokenizer "
                  "(headlab.attach(model, tokenizer=...)); the argument goes in the next release",
                  DeprecationWarning, stacklevel=2 + depth)
    copy = HeadedModel(handle.model, tokenizer=tokenizer, source=handle.source)
    return copy


def model_max_length(model: nn.Module, tokenizer: Any = None) -> int | None:
    """The longest input the model takes, in pieces, special tokens included; None when nothing says.

    The smallest of: ``config.max_position_embeddings`` (of the text config, for a multimodal
    model); the tokenizer's ``model_max_length`` (Hugging Face's "no limit", about 1e30, does not
    count); and, for every learned table of absolute positions beside the token embedding (in the
    same module: not a vision tower's), the rows a position can use. A position table is an
    ``nn.Embedding`` whose attribute name holds "position" (``position_embeddings``,
    ``embed_positions``). When it has a ``padding_idx``, positions are counted from just after it
    (RoBERTa and its kin number tokens ``padding_idx + 1, padding_idx + 2, …``), so only
    ``num_embeddings − padding_idx − 1`` rows are usable: 514 − 1 − 1 = 512 for roberta-base,
    where ``max_position_embeddings`` says 514. For a table whose positions start at 0 in spite of
    a ``padding_idx`` the rule gives up ``padding_idx + 1`` positions it could have used; it never
    gives more than the model takes.

    Args:
        model: the model itself (``HeadedModel.model``).
        tokenizer: its tokenizer, or None.

    Returns:
        The limit, or None.
    """
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config  # a multimodal model's text part
    limits = [getattr(text, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    beside = _input_embedding_parent(model)
    for name, module in model.named_modules():
        parent, _, attribute = name.rpartition(".")
        if isinstance(module, nn.Embedding) and "position" in attribute and beside in (None, parent):
            first = 0 if module.padding_idx is None else module.padding_idx + 1  # padding_idx is stored ≥ 0
            limits.append(module.num_embeddings - first)
    usable = [n for n in limits if isinstance(n, int) and 0 < n < 1_000_000]  # HF's "no limit" is ~1e30
    return min(usable) if usable else None


def _input_embedding_parent(model: nn.Module) -> str | None:
    """The name of the module that holds the token embedding (``token_embedding``), or None where the model
    does not say: a position table counts only beside it (not a vision tower's of a multimodal model)."""
    embedding = token_embedding(model)
    found = next((name for name, module in model.named_modules() if module is embedding), None)
    return None if embedding is None or found is None else found.rpartition(".")[0]


def token_embedding(model: nn.Module) -> nn.Module | None:
    """The embedding of ``model``'s token ids (``get_input_embeddings``); for a model of several towers without one
    input embedding (CLIP), its text tower's: the first submodel whose main input is token ids. None where the
    model does not say."""
    try:
        return cast(Any, model).get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except NotImplementedError:
        text = next((m for m in model.modules() if m is not model and hasattr(m, "get_input_embeddings")
                     and getattr(m, "main_input_name", None) == "input_ids"), None)
        return None if text is None else cast(Any, text).get_input_embeddings()


def _first_argument(model: nn.Module) -> str:
    """The name of the first parameter of ``model.forward`` (what a tensor input is passed as)."""
    parameters = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not parameters:
        raise TypeError(f"{type(model).__name__}.forward takes no positional argument; pass a dict of its arguments")
    return parameters[0].name


def _interventions(site: AttentionSite) -> str:
    """What is set on a site's heads, in a few words ("" when nothing)."""
    parts = []
    scale = site.scale
    if scale is not None:
        zeroed = [h for h, s in enumerate(scale.tolist()) if s == 0]
        if zeroed:
            parts.append(f"heads {zeroed} zeroed" if site.shift is None else f"heads {zeroed} ablated")
        if len(zeroed) < int((scale != 1).sum()):
            parts.append("scaled")
    if site.windows:
        parts.append("windowed")
    return ", ".join(parts)
