"""Real transformers models, any architecture that dispatches attention through transformers'
``AttentionInterface``, with headlab's attention implementation attached.

    handle.py     HeadedModel: the one handle of a model with heads (what load and attach return)
    interface.py  the attention function registered as "headlab"
    site.py       AttentionSite: one attention module's heads, gates, tap, output projection
    native.py     LayerSite: the sites of headlab's own layers (MultiHeadAttention, TinyTransformer)
    calls.py      what the probe records: attention calls and the projections around them
    probe.py      one small forward that finds the attention modules and their projections
    audio.py      inputs of a model that takes log-mel features (Whisper): their shape, WAV files, extractors
    media.py      files of one medium (images, recordings) from paths, folders and objects in memory, named
    multimodal.py models of several towers (CLIP, Gemma 3, LLaVA): their vision tower, image tokens, inputs
    layout.py     which projection rows make each head's q, k and v
    attach.py     attach / detach
    pruning.py    physical pruning of heads, checked against masking
    loading.py    load: the packaged MiniLM, a local checkpoint or a hub id
    saved.py      the folder format of a saved (pruned, intervened) model

transformers is imported when a model is loaded or attached, not on import.
"""

from headlab.layer.taps import TAKE, Tap, TapOutput
from headlab.models.attach import attach, attention_sites, detach
from headlab.models.handle import HeadedModel, headed, model_max_length
from headlab.models.loading import __getattr__ as __getattr__  # the module's: the renamed LoadedModel (PEP 562)
from headlab.models.loading import default_model_path, load
from headlab.models.native import LayerSite
from headlab.models.site import AttentionSite

__all__ = ["TAKE", "AttentionSite", "HeadedModel", "LayerSite", "Tap", "TapOutput", "attach", "attention_sites",
           "default_model_path", "detach", "headed", "load", "model_max_length"]

