"""Shards for the Ray engine: how a corpus is cut, and the worker that captures one.

A shard is a contiguous run of the whole corpus's ``plan_batches`` batches (longest first).
A worker that re-plans the shard's items (in corpus order, with the same bounds) gets exactly
those batches: the sort by (length desc, index) restricted to the shard is a contiguous piece
of the whole sort, and a least-cost plan restricted to a run of its batches is that run's own
least-cost plan (``plan_batches``: exact int costs, ties broken the same way). Every batch, and so
every float computed from it, is the one a single-process ``capture`` computes; only the order of
the float64 additions that merge the shards differs.

``ShardWorker`` is what runs on a Ray worker. This module imports no Ray at import time: the
driver wraps the class with ``ray.remote`` and Ray ships it by reference (each worker imports this
module from its own headlab). The model is loaded on the worker from its source name, once per
worker process (again after a restart), never pickled from the driver.

The factory and what a shard sends back travel as ``pack``'s bytes: Ray's cloudpickle with every
plain CPU tensor as a numpy array. Torch pickles a tensor through its storage, at a fixed cost each
way however small the tensor, and analyze's accumulators hold a few hundred small float64 tensors
(a sum per layer and statistic).
"""

from __future__ import annotations

import bisect
import os
import platform
import resource
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from headlab.capture.batching import batch_cost, plan_batches

__all__ = ["ModelPlan", "Shard", "ShardOutput", "ShardWorker", "merges_itself", "model_fingerprint", "pack",
           "peak_rss_bytes", "plan_shards", "unpack"]


@dataclass(frozen=True)
class Shard:
    """A contiguous run of the corpus's length-sorted batches, captured by one worker.

    Attributes:
        index: the shard's place in the merge order (0-based).
        count: shards in the run.
        items: the corpus indices of its items, ascending (local index i is ``items[i]``).
        first_batch: the index of its first batch among the whole corpus's batches.
        batches: batches it holds.
        tokens: real tokens; padded_tokens: ``Σ batch × pos`` over its batches.
    """

    index: int
    count: int
    items: tuple[int, ...]
    first_batch: int
    batches: int
    tokens: int
    padded_tokens: int

    def __str__(self) -> str:
        shown = ", ".join(map(str, self.items[:8])) + (" …" if len(self.items) > 8 else "")
        last = self.first_batch + self.batches - 1
        return (f"shard {self.index} of {self.count} (batches {self.first_batch}–{last} of the length-sorted plan; "
                f"{len(self.items)} items, corpus indices {shown})")


def plan_shards(lengths: Sequence[int], *, shards: int, batch_tokens: int | None = 4096,
                max_batch_size: int | None = 64) -> list[Shard]:
    """Cut a corpus into shards of whole batches of ``plan_batches``, contiguous in its order.

    Args:
        lengths: each item's length in pieces (after truncation), in corpus order.
        shards: at most this many shards (fewer when there are fewer batches).
        batch_tokens, max_batch_size: as ``capture`` takes them.

    Returns:
        The shards in order; every item is in exactly one.

    Raises:
        ValueError: ``shards`` is not a positive int, or a bound or length ``plan_batches`` refuses.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards={shards!r}; expected a positive int")
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    padded = [len(b) * lengths[b[0]] for b in batches]  # longest first: the first item sets pos
    cost = [batch_cost(len(b), lengths[b[0]]) for b in batches]
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    n = min(shards, len(batches))
    cuts = [0]
    for k in range(1, n):  # the cut nearest to k/n of the cost, leaving each shard at least one batch
        target = prefix[-1] * k / n
        j = bisect.bisect_left(prefix, target)
        if j > 0 and target - prefix[j - 1] < prefix[j] - target:
            j -= 1
        cuts.append(min(max(j, cuts[-1] + 1), len(batches) - (n - k)))
    cuts.append(len(batches))
    return [Shard(index=k, count=n, items=tuple(sorted(i for b in batches[lo:hi] for i in b)), first_batch=lo,
                  batches=hi - lo, tokens=sum(lengths[i] for b in batches[lo:hi] for i in b),
                  padded_tokens=sum(padded[lo:hi]))
            for k, (lo, hi) in enumerate(pairwise(cuts))]


@dataclass(frozen=True)
class ModelPlan:
    """What the driver needs to cut a corpus into shards, computed where the tokenizer lives.

    Attributes:
        lengths: each item's length in pieces after truncation, in corpus order.
        truncated: corpus indices of the items cut to ``max_length``.
        max_length: the truncation length every shard is captured with (None: no limit).
    """

    lengths: tuple[int, ...]
    truncated: tuple[int, ...]
    max_length: int | None


@dataclass
class ShardOutput:
    """One shard's accumulators and capture record, as a worker sends them back.

    Attributes:
        consumers: the factory's accumulators holding the shard's sums (fresh ones with the
            shard merged in, so that working buffers stay on the worker), as ``pack``'s bytes: the
            structure the factory made when it merges itself (``merges_itself``), else their list.
        capture: the shard's ``CaptureResult`` (corpus indices local to the shard).
        seconds: the worker's wall time on the shard (capture and repacking).
        cpu_seconds: the CPU time its process spent meanwhile (all threads; below ``seconds`` when
            the worker waited for a core).
        worker: ``host:pid`` of the process that ran it.
        peak_rss_bytes: that process's peak resident memory so far.
    """

    consumers: bytes
    capture: Any
    seconds: float
    cpu_seconds: float
    worker: str
    peak_rss_bytes: int


def pack(value: Any) -> bytes:
    """``value`` pickled with Ray's cloudpickle, each plain CPU tensor as a numpy array (``unpack`` reverses it).

    A plain tensor: of type ``torch.Tensor`` itself (not a Parameter or other subclass), strided, on the
    CPU, without autograd, in a dtype numpy has. It comes back with the same values, shape and dtype,
    owning its memory (views of one storage come back as separate tensors). Any other tensor keeps
    torch's own pickling.
    """
    import io
    import pickle

    from ray import cloudpickle

    class Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is torch.Tensor and _as_array(obj):
                return torch.from_numpy, (obj.detach().numpy(),)
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def unpack(blob: bytes) -> Any:
    """What ``pack`` packed."""
    import pickle

    return pickle.loads(blob)


def _as_array(tensor: torch.Tensor) -> bool:
    """Whether ``pack`` sends ``tensor`` as a numpy array (same values, shape and dtype back)."""
    return (tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.requires_grad
            and not tensor.is_conj() and not tensor.is_neg() and tensor.dtype in _NUMPY_DTYPES)


_NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128})


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if platform.system() == "Darwin" else peak * 1024)


def model_fingerprint(loaded: Any) -> dict[str, Any]:
    """Per-layer head counts and addresses, and the interventions set: what must match between driver and workers."""
    from headlab.heads.interventions import summary

    return {"heads": loaded.n_heads, "names": [site.address for site in loaded.sites],
            "interventions": summary(loaded)}


class ShardWorker:
    """Holds one loaded model and captures shards with it.

    Args:
        source: the model's directory or hub id, or None for the packaged MiniLM (resolved on
            the worker, so that every node finds its own install).
        dtype: the weights' dtype name, or None for float32.
        threads: torch (and tokenizer) threads of this worker.
    """

    def __init__(self, source: str | None, dtype: str | None, threads: int) -> None:
        # Before the tokenizer's thread pool starts (it reads this once, at first use).
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        self.source, self.dtype, self.threads = source, dtype, threads
        self._loaded: Any = None
        self._factory_ref: str | None = None  # the run whose factory is unpacked, by its object reference
        self._factory_of_run: Callable[[Any], Iterable[Any]] | None = None

    def _factory(self, ref: Any) -> Callable[[Any], Iterable[Any]]:
        """The consumer factory behind ``ref``, unpacked on its first shard and kept for the rest of its run."""
        factory = self._factory_of_run
        if self._factory_ref != ref.hex() or factory is None:  # both are set together
            import ray

            factory = unpack(ray.get(ref))
            self._factory_ref, self._factory_of_run = ref.hex(), factory
        return factory

    def loaded(self) -> Any:
        """The model, loaded on first use (a bad source fails the call that needs it, with the loader's error)."""
        if self._loaded is None:
            import headlab

            self._loaded = headlab.load(self.source, dtype=self.dtype)
        return self._loaded

    def ready(self) -> dict[str, Any]:
        """Load the model now (workers load while the driver plans); returns ``model_fingerprint``."""
        return model_fingerprint(self.loaded())

    def plan(self, texts: Sequence[str], max_length: int | None) -> ModelPlan:
        """Tokenize the whole corpus as ``capture`` would, for the driver's batch plan.

        Args:
            texts: every item, in corpus order.
            max_length: as ``capture`` takes it (None: the model's limit).
        """
        from headlab.capture.encoding import tokenize_corpus

        loaded = self.loaded()
        if max_length is None:
            max_length = loaded.max_length
        tokenized = tokenize_corpus(loaded.tokenizer, texts, max_length=max_length)
        return ModelPlan(lengths=tuple(tokenized.lengths), truncated=tuple(tokenized.truncated),
                         max_length=max_length)

    def run(self, shard: Any, texts: Sequence[str], packed_factory: list[Any], options: dict[str, Any]) -> ShardOutput:
        """Capture one shard into fresh accumulators from ``factory(shard)``.

        Args:
            shard: the ``Shard`` (its items are the corpus indices of ``texts``, in order).
            texts: the shard's items, in corpus order.
            packed_factory: ``[ref]``, the Ray object reference of the factory's ``pack`` bytes (in a list, so
                that Ray hands over the reference: the factory is unpacked once per run, not once per shard).
            options: ``capture``'s keyword options (heads, take, batch_tokens, max_batch_size, max_length).
        """
        from headlab.capture.run import TruncationWarning, capture

        start, cpu = time.perf_counter(), time.process_time()
        factory = self._factory(packed_factory[0])
        consumers = _check_consumers(factory(shard))
        with warnings.catch_warnings():  # the driver reports truncation once, for the whole corpus
            warnings.simplefilter("ignore", TruncationWarning)
            result = capture(self.loaded(), corpus=list(texts), consumers=consumers, progress=False, **options)
        # A consumer's working buffers (reused temporaries) would travel with it: send back a fresh
        # accumulator holding the shard's sums instead. Adding to a fresh one copies them exactly.
        made = factory(shard)
        fresh = _check_consumers(made)
        if [type(c) for c in fresh] != [type(c) for c in consumers]:
            raise TypeError("the consumer factory returned different accumulators for the same shard")
        for empty, full in zip(fresh, consumers):
            empty.merge(full)
        sent = made if merges_itself(made) else fresh
        return ShardOutput(consumers=pack(sent), capture=result, seconds=time.perf_counter() - start,
                           cpu_seconds=time.process_time() - cpu, worker=f"{socket.gethostname()}:{os.getpid()}",
                           peak_rss_bytes=peak_rss_bytes())


def merges_itself(made: Any) -> bool:
    """Whether a factory made one structure that holds its accumulators by name, iterates over them and
    merges itself as a whole (``merge``; e.g. analyze's ``PassAccumulators``), rather than a list or tuple
    of accumulators merged one by one. Such a structure travels back and is merged as it is."""
    return not isinstance(made, (list, tuple)) and callable(getattr(made, "merge", None))


def _check_consumers(consumers: Iterable[Any]) -> list[Any]:
    consumers = list(consumers)
    for consumer in consumers:
        for method in ("update", "merge"):
            if not callable(getattr(consumer, method, None)):
                raise TypeError(f"consumer {consumer!r} has no {method}() method; the Ray engine merges the shards' "
                                "accumulators (update / merge / result)")
    return consumers
