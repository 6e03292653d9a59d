"""Run a model on a text (one call, a cache of named sites) or over a corpus in batches (the
selected heads' tensors handed to consumers).

    cache.py      run_with_cache(...) -> Cache: blocks.{layer}.attn.{pattern,z,result,q,k,v}
    corpus.py     load_corpus: a file, a list of strings, or the bundled corpus
    encoding.py   tokenize once, with offsets and word ids; truncation on the record
    batching.py   length-bucketed batches under a token budget; a batch's length groups for its readers
    batch.py      CaptureBatch: what a consumer receives per batch
    taps.py       what a tap takes; taps that are always removed
    run.py        capture(...) -> CaptureResult
    audio.py      capture_audio(...): an audio encoder-decoder (Whisper) over recordings, its frames as positions
    means.py      MeanZ, mean_z: each head's mean z, for mean-ablation
    words.py      word-piece → word patterns (Clark et al. 2019)
    distributed.py the Ray engine: a corpus in shards on Ray workers, accumulators merged (headlab[ray])
    _shards.py    shards cut from capture's batches; the worker that captures one
"""

from headlab.capture.batch import CaptureBatch, LayerCapture, collate
from headlab.capture.batching import PaddingStats, batch_cost, length_groups, naive_batches, padding_stats, plan_batches
from headlab.capture.cache import Cache, run_with_cache
from headlab.capture.corpus import Corpus, load_corpus
from headlab.capture.distributed import RayEngine, Shard, ShardedCapture, ShardError, plan_shards, sharded_capture
from headlab.capture.encoding import TokenizedCorpus, tokenize_corpus
from headlab.capture.means import MeanZ, mean_z
from headlab.capture.run import CaptureResult, Consumer, TruncationWarning, capture, model_max_length
from headlab.capture.taps import tapped
from headlab.capture.words import (
    WordMap,
    batch_word_ids_from_spans,
    pattern_to_words,
    unit_labels,
    whitespace_spans,
    word_ids_from_spans,
    word_units,
)

__all__ = [
    "Cache", "CaptureBatch", "CaptureResult", "Consumer", "Corpus", "LayerCapture", "MeanZ", "PaddingStats",
    "RayEngine", "Shard", "ShardError", "ShardedCapture", "TokenizedCorpus", "TruncationWarning", "WordMap",
    "batch_cost", "batch_word_ids_from_spans", "capture", "collate", "length_groups", "load_corpus", "mean_z",
    "model_max_length", "naive_batches", "padding_stats", "pattern_to_words", "plan_batches", "plan_shards",
    "run_with_cache", "sharded_capture", "tapped", "tokenize_corpus", "unit_labels", "whitespace_spans",
    "word_ids_from_spans", "word_units",
]
