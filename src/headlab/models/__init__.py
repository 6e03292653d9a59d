"""Load a checkpoint (local directory, hub id, or the packaged MiniLM) with headlab attention layers.

``load`` returns a ``LoadedModel`` (the transformers model, its tokenizer, where it came from and
its family); ``attention_modules`` and ``attention_layers`` list the swapped modules and their
headlab layers in layer order. transformers is imported when ``load`` runs, not on import.
"""

from headlab.models.loading import LoadedModel, default_model_path, load
from headlab.models.modules import attention_layers, attention_modules

__all__ = ["LoadedModel", "attention_layers", "attention_modules", "default_model_path", "load"]
