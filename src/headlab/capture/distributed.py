"""The Ray engine: a corpus captured in shards on Ray workers, their accumulators merged on the driver.

    sharded_capture(model, corpus, *, consumers=factory, workers=None, address=None, ...) -> ShardedCapture
    RayEngine(model, *, workers=None, address=None, threads_per_worker=1, max_retries=3)
        .run(corpus, *, consumers=factory, heads=None, take=("pattern",), ...) -> ShardedCapture
    plan_shards(lengths, *, shards, batch_tokens, max_batch_size) -> list[Shard]

Ray is the optional extra ``headlab[ray]``; without it the engine raises ``ImportError`` naming it.
With no ``address`` a local Ray starts on this machine (``workers × threads_per_worker`` CPUs) and
stops when the engine closes; with ``address`` (``"auto"`` or ``"host:6379"``) the engine joins a
running cluster. A Ray already initialised in this process is used as it is.

How a run goes:
1. One worker tokenizes the corpus as ``capture`` would and the driver plans capture's
   length-bucketed batches (``plan_batches``) for the whole corpus. A shard is a contiguous run
   of those batches (longest first), shards balanced by the batches' ``batch_cost`` (padded tokens
   weighed by ``1 + pos / POS_WEIGHT``, a batch's attention work grows with pos², and a fixed cost per
   batch). A worker re-plans its shard's items into exactly those batches (checked), so every batch,
   and every number computed from it, is the one a single-process ``capture`` computes.
2. Each worker (a Ray actor of ``threads_per_worker`` CPUs, torch limited to as many threads)
   loads the model once, from its source name (a directory, a hub id, or None for the packaged
   MiniLM), with ``headlab.load``; the model is never pickled. Idle workers take the next shard.
3. Per shard a worker calls ``consumers(shard)`` (the factory) for fresh accumulators, runs
   ``capture`` on the shard's texts into them and sends them back. Shipped to a worker: the model's
   source name and dtype, each shard's texts and ``Shard``, the factory (once, through Ray's object
   store). Shipped back: the shard's accumulators and its ``CaptureResult``. The factory and the
   accumulators travel as ``_shards.pack`` bytes (plain CPU tensors as numpy arrays).
4. The driver merges the accumulators in shard order (``merge``), so the result does not depend on
   which worker finished first; float64 sums equal the single-process ones to rounding (1e-12).

The factory takes the ``Shard``: accumulators keyed by corpus index, or seeded per batch, read
their offsets from it (``shard.items`` maps the shard's local corpus index i to ``items[i]``;
``shard.first_batch`` is its first batch's index in the whole corpus). The factory returns a list
of accumulators, merged one by one in the list's order, or one structure that holds them by name,
iterates over them and merges itself (``_shards.merges_itself``). ``analyze``'s factory is
``headlab.analysis.capture_pass.AnalysisAccumulators``, whose ``PassAccumulators`` is such a structure
(similarity's sample starts at ``shard.first_batch``; syntax gets the shard's parses, made on the driver)::

    accumulators = AnalysisAccumulators(causal=False, parses=None)  # picklable: a module-level class
    run = sharded_capture(None, texts, consumers=accumulators, workers=4, address=None)
    run.consumers.surface.result(); run.capture  # a PassAccumulators; a CaptureResult of the whole corpus

Failures: a worker process that dies (killed, out of memory) is restarted by Ray, which reloads the
model and retries its shard, up to ``max_retries`` times; the merged result is unchanged. A shard
that raises (bad input) is not retried: ``ShardError`` names the shard (its index, batches and
corpus indices) and carries the worker's exception. No shard is ever dropped.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from headlab.capture._shards import Shard, merges_itself, pack, plan_shards, unpack
from headlab.capture.corpus import Corpus, load_corpus
from headlab.capture.run import CaptureResult, Consumer, RateProgress, warn_truncated
from headlab.capture.taps import renamed_take
from headlab.layer.selection import HeadSelection, resolve

__all__ = ["CONNECT_TIMEOUT_S", "INSTALL", "ConsumerFactory", "RayEngine", "Shard", "ShardError", "ShardReport",
           "ShardedCapture", "check_address", "plan_shards", "sharded_capture"]

INSTALL = "pip install 'headlab[ray]'"
SHARDS_PER_WORKER = 8  # enough that the last shards to finish are small


ConsumerFactory = Callable[[Shard], Iterable[Consumer]]  # a list, or a structure that merges itself


class ShardError(RuntimeError):
    """A shard failed: its worker raised (bad input), or its worker died more than ``max_retries`` times.

    Attributes:
        shard: the ``Shard``.
        cause: the worker's exception (or Ray's report of the dead worker).
        worker_died: True when the worker process died rather than raised.
    """

    def __init__(self, shard: Shard, cause: BaseException, *, worker_died: bool, retries: int = 0) -> None:
        if worker_died:
            said = str(cause).strip().splitlines()
            what = (f"its worker process died, and kept dying through max_retries={retries} restarts "
                    f"({said[0] if said else type(cause).__name__})")
        else:
            what = f"{type(cause).__name__}: {cause}"
        super().__init__(f"{shard} failed: {what}")
        self.shard, self.cause, self.worker_died = shard, cause, worker_died


@dataclass(frozen=True)
class ShardReport:
    """Where and how long one shard ran.

    Attributes:
        shard: the shard.
        worker: ``host:pid`` of the worker process that completed it.
        seconds: its wall time on that worker.
        cpu_seconds: the CPU time the worker spent meanwhile (below ``seconds``: it waited for a core).
        peak_rss_bytes: that worker's peak resident memory when it finished.
    """

    shard: Shard
    worker: str
    seconds: float
    cpu_seconds: float
    peak_rss_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard.index, "items": len(self.shard.items), "batches": self.shard.batches,
                "tokens": self.shard.tokens, "worker": self.worker, "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds, "peak_rss_bytes": self.peak_rss_bytes}


@dataclass
class ShardedCapture:
    """A sharded run: the merged accumulators and the whole corpus's capture record.

    Attributes:
        consumers: the factory's accumulators, every shard merged in shard order: a list, or the structure
            the factory makes when it merges itself (``analyze``'s ``PassAccumulators``).
        capture: as ``capture`` returns it for the whole corpus (corpus indices global; ``seconds``
            is the driver's wall time, planning included).
        shards: one report per shard, in shard order.
        workers: Ray workers used; threads_per_worker: torch threads of each.
    """

    consumers: Any
    capture: CaptureResult
    shards: list[ShardReport]
    workers: int
    threads_per_worker: int

    def to_dict(self) -> dict[str, Any]:
        return {"capture": self.capture.to_dict(), "workers": self.workers,
                "threads_per_worker": self.threads_per_worker, "shards": [s.to_dict() for s in self.shards]}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"the Ray engine needs Ray: {INSTALL}") from err
    return ray


def _positive(name: str, value: Any, *, zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ValueError(f"{name}={value!r}; expected a {'non-negative' if zero else 'positive'} int")


class RayEngine:
    """Ray workers that each hold the model, ready to capture corpora in shards.

    Args:
        model: a checkpoint directory or hub id, None for the packaged MiniLM, or a ``HeadedModel``
            (its source and dtype are used; in-memory changes that its source lacks are refused).
        workers: Ray workers (actors); None: as many as the CPUs allow (``os.cpu_count()`` locally,
            the cluster's CPUs with ``address``) divided by ``threads_per_worker``.
        address: a running Ray cluster to join (``"auto"``, ``"host:port"``); None starts a local Ray.
        threads_per_worker: CPUs each worker reserves and torch threads it runs.
        max_retries: restarts of a dead worker, each retrying its shard.

    Raises:
        ImportError: Ray is not installed (the message names ``headlab[ray]``).
        ValueError: a bad number or address, or more workers than the cluster has CPUs for.
        ConnectionError: no Ray cluster answers at ``address`` (a TCP probe of its host and port,
            ``CONNECT_TIMEOUT_S``, before Ray's own minutes of retries).

    Warns:
        RuntimeWarning: a local Ray asked for more CPUs (workers × threads_per_worker) than this machine has: the
            workers would share its cores, slower than fewer workers (the message says how many fit).
    """

    def __init__(self, model: Any = None, *, workers: int | None = None, address: str | None = None,
                 threads_per_worker: int = 1, max_retries: int = 3) -> None:
        self.ray = ray = _import_ray()
        _positive("threads_per_worker", threads_per_worker)
        _positive("max_retries", max_retries, zero=True)
        if workers is not None:
            _positive("workers", workers)
        self.source, self.dtype, self.fingerprint = _model_source(model)
        self.threads, self.max_retries, self._started = threads_per_worker, max_retries, False
        if not ray.is_initialized():
            if address is not None:
                check_address(address)  # Ray itself retries an unreachable address for minutes
            try:
                if address is None:
                    machine = os.cpu_count() or 1
                    cpus = (workers or max(1, machine // threads_per_worker)) * threads_per_worker
                    if cpus > machine:
                        fits = max(1, machine // threads_per_worker)
                        warnings.warn(f"workers={workers} × threads_per_worker={threads_per_worker} asks for {cpus} "
                                      f"CPUs of this machine's {machine}: the workers share its cores and the run is "
                                      f"slower than with {fits}; pass workers={fits} (--workers {fits}) or fewer",
                                      RuntimeWarning, stacklevel=2)
                    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                             logging_level="WARNING")
                else:
                    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
            except ConnectionError as err:
                raise ConnectionError(
                    f"no Ray cluster answers at address={address!r}: {err}; a cluster with token authentication "
                    "also needs RAY_AUTH_MODE=token and its token on this machine (docs/scaling.md)") from err
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self.workers = workers or max(1, cpus // threads_per_worker)
        if self.workers * threads_per_worker > cpus:
            self.close()
            raise ValueError(f"workers={self.workers} × threads_per_worker={threads_per_worker} needs "
                             f"{self.workers * threads_per_worker} CPUs; the Ray cluster has {cpus}")
        free = int(ray.available_resources().get("CPU", 0))
        if self.workers * threads_per_worker > free:
            warnings.warn(f"{free} of the Ray cluster's {cpus} CPUs are free: workers wait for the rest to be released",
                          RuntimeWarning, stacklevel=2)
        from headlab.capture._shards import ShardWorker

        remote = ray.remote(ShardWorker).options(
            num_cpus=threads_per_worker, max_restarts=max_retries, max_task_retries=max_retries,
            scheduling_strategy="SPREAD")
        self.actors = [remote.remote(self.source, self.dtype, threads_per_worker) for _ in range(self.workers)]
        self._ready = [actor.ready.remote() for actor in self.actors]  # models load while the driver plans

    def run(self, corpus: str | os.PathLike[str] | Sequence[str] | Corpus | None = None, *,
            consumers: ConsumerFactory, heads: HeadSelection = None, take: str | Sequence[str] = ("pattern",),
            batch_tokens: int | None = 4096, max_batch_size: int | None = 64, max_length: int | None = None,
            shards: int | None = None, workers: int | None = None, progress: bool = True,
            max_pattern_memory: int | None = None, what: str | Sequence[str] | None = None) -> ShardedCapture:
        """Capture ``corpus`` in shards on the workers and merge their accumulators.

        Args:
            corpus: as ``load_corpus`` takes it (read on the driver; texts are shipped).
            consumers: the factory: ``consumers(shard)`` returns fresh accumulators (``update``,
                ``merge``, ``result``), as a list or as one structure that iterates over them and merges
                itself (``PassAccumulators``); called on the workers, so it must pickle (cloudpickle).
            heads, take, batch_tokens, max_batch_size, max_length: as ``capture`` takes them.
            max_pattern_memory: as ``capture`` takes it, per worker (None: a share of each worker's free memory).
            shards: most shards; None: ``SHARDS_PER_WORKER`` per worker of the engine (also when
                ``workers`` uses fewer, so that the result does not depend on it).
            workers: use only this many of the engine's workers (to measure scaling, or to leave some
                idle); None: all. The merged result is bit-identical whatever the number.
            progress: a progress bar over shards with tokens per second.
            what: deprecated name of ``take``.

        Returns:
            The merged accumulators, the corpus's ``CaptureResult`` and a report per shard.

        Raises:
            ShardError: a shard raised, or its worker died more than ``max_retries`` times.
            ValueError / TypeError / OSError: a bad corpus or option, or a model the workers cannot
                load (the loader's error), or one that differs from the ``HeadedModel`` given.
        """
        ray, start = self.ray, time.perf_counter()
        take = renamed_take(take, what, "what", "RayEngine.run")
        corpus = load_corpus(corpus)
        if not callable(consumers):
            raise TypeError(f"consumers must be a factory, consumers(shard) -> accumulators; got {consumers!r}")
        if shards is not None:
            _positive("shards", shards)
        if workers is not None:
            _positive("workers", workers)
            if workers > len(self.actors):
                raise ValueError(f"workers={workers}; this engine has {len(self.actors)}")
        actors = self.actors[:workers]
        fingerprints = self._get(self._ready)
        differ = [f for f in fingerprints if self.fingerprint is not None and f != self.fingerprint]
        if differ:
            raise ValueError(f"the model differs from the one workers load from {self.source!r} "
                             f"(heads per layer, interventions: {self.fingerprint} here, {differ[0]} there); "
                             "save it with headlab.heads.save(model, folder) and pass the folder")
        # a bad selection fails here, as capture's ValueError, not per shard
        resolve(heads, fingerprints[0]["heads"], fingerprints[0]["names"])
        plan = self._get([self.actors[0].plan.remote(list(corpus.texts), max_length)])[0]
        warn_truncated(plan.truncated, len(corpus), plan.max_length)
        # As many shards whichever of the engine's workers run: the same shards merged in the same order
        # give bit-identical results with 1 worker or all of them.
        cut = plan_shards(plan.lengths, shards=shards or SHARDS_PER_WORKER * len(self.actors),
                          batch_tokens=batch_tokens, max_batch_size=max_batch_size)
        options = {"heads": heads, "take": take, "batch_tokens": batch_tokens, "max_batch_size": max_batch_size,
                   "max_length": plan.max_length, "max_pattern_memory": max_pattern_memory}
        packed_factory = [ray.put(pack(consumers))]  # shipped once; each worker fetches and unpacks it once per run
        merged, first, reports, outputs, done, blocked = None, None, [], {}, 0, 0
        queue, running = list(range(len(cut)))[::-1], {}

        def submit(actor: Any) -> None:
            if queue:
                k = queue.pop()
                texts = [corpus.texts[i] for i in cut[k].items]
                running[actor.run.remote(cut[k], texts, packed_factory, options)] = (k, actor)

        with RateProgress(progress, len(cut), label="ray", unit="shards") as bar:
            for actor in actors:
                submit(actor)
            while running:
                ready, _ = ray.wait(list(running), num_returns=1)
                k, actor = running.pop(ready[0])
                submit(actor)  # the worker starts its next shard while the driver reads and merges this one
                outputs[k] = self._shard_output(ready[0], cut[k])
                while done in outputs:  # merge in shard order, holding only shards that finished early
                    out = outputs.pop(done)
                    reports.append(ShardReport(cut[done], out.worker, out.seconds, out.cpu_seconds, out.peak_rss_bytes))
                    first = out.capture if first is None else first  # every shard captures the same layers and sites
                    blocked += out.capture.blocked
                    merged = _merge(merged, unpack(out.consumers))
                    done += 1
                tokens = sum(cut[j].tokens for j in outputs) + sum(r.shard.tokens for r in reports)
                bar.advance(tokens / (time.perf_counter() - start))
        assert first is not None  # every shard ran: the corpus is not empty
        result = CaptureResult(
            items=len(corpus), tokens=sum(plan.lengths), padded_tokens=sum(s.padded_tokens for s in cut),
            batches=sum(s.batches for s in cut), truncated=list(plan.truncated), max_length=plan.max_length,
            layers=first.layers, take=first.take, seconds=time.perf_counter() - start, corpus=corpus.to_dict(),
            pattern_memory=first.pattern_memory, blocked=blocked)
        return ShardedCapture(consumers=merged, capture=result, shards=reports, workers=len(actors),
                              threads_per_worker=self.threads)

    def _get(self, refs: list[Any]) -> list[Any]:
        """``ray.get`` of setup calls, raising the worker's own exception (a bad model source, say)."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as err:
            cause = err.cause
            if isinstance(cause, Exception):
                if sys.version_info >= (3, 11):  # add_note is 3.11's: on 3.10 the cause goes up without it
                    cause.add_note(f"(raised on a Ray worker loading the model {self.source or 'packaged MiniLM'!r})")
                raise cause from None
            raise

    def _shard_output(self, ref: Any, shard: Shard) -> Any:
        exceptions = self.ray.exceptions
        try:
            out = self.ray.get(ref)
        except exceptions.RayActorError as err:
            raise ShardError(shard, err, worker_died=True, retries=self.max_retries) from err
        except exceptions.RayTaskError as err:
            raise ShardError(shard, err.cause if err.cause is not None else err, worker_died=False) from err
        got = (out.capture.batches, out.capture.padded_tokens, out.capture.tokens)
        if got != (shard.batches, shard.padded_tokens, shard.tokens):
            raise RuntimeError(f"{shard}: the worker batched it differently from the plan (batches, padded tokens, "
                               f"tokens: {got}, planned {(shard.batches, shard.padded_tokens, shard.tokens)}); "
                               "the merged result would not equal a single-process capture")
        return out

    def close(self) -> None:
        """Stop the workers, and the local Ray if this engine started it."""
        for actor in getattr(self, "actors", []):
            self.ray.kill(actor)
        self.actors = []
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
        self._started = False

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sharded_capture(model: Any = None, corpus: str | os.PathLike[str] | Sequence[str] | Corpus | None = None, *,
                    consumers: ConsumerFactory, workers: int | None = None, address: str | None = None,
                    threads_per_worker: int = 1, max_retries: int = 3, **options: Any) -> ShardedCapture:
    """One sharded run: start (or join) Ray, capture ``corpus`` on the workers, merge, stop.

    Args:
        model, workers, address, threads_per_worker, max_retries: as ``RayEngine`` takes them.
        corpus, consumers: as ``RayEngine.run`` takes them.
        options: ``RayEngine.run``'s other options (heads, what, batch_tokens, max_batch_size,
            max_length, shards, progress).

    Returns:
        As ``RayEngine.run``.

    Raises:
        As ``RayEngine`` and ``RayEngine.run``.
    """
    with RayEngine(model, workers=workers, address=address, threads_per_worker=threads_per_worker,
                   max_retries=max_retries) as engine:
        return engine.run(corpus, consumers=consumers, **options)


def _merge(held: Any, consumers: Any) -> Any:
    """Fold the next shard's accumulators into those merged so far (None before the first shard): a
    structure that merges itself as a whole, else a list merged one by one."""
    if held is None:
        return consumers if merges_itself(consumers) else list(consumers)
    if merges_itself(consumers):
        combined = held.merge(consumers)
        return held if combined is None else combined
    if len(consumers) != len(held):
        raise TypeError(f"the consumer factory returned {len(consumers)} accumulators for one shard and "
                        f"{len(held)} for another")
    for i, other in enumerate(consumers):
        combined = held[i].merge(other)
        held[i] = held[i] if combined is None else combined  # merge returns self, or a new accumulator
    return held


CONNECT_TIMEOUT_S = 5.0  # how long an address may take to accept a TCP connection before it is refused


def check_address(address: str) -> None:
    """Raise at once when ``address`` is not one of a Ray cluster, or nothing listens there.

    ``"auto"`` reads the address the way Ray does (``RAY_ADDRESS``, then the address file the last
    local ``ray start`` left in the temp folder); with neither, Ray's own error says so. A
    ``ray://`` (Ray Client) address is probed at its host and port too.

    Raises:
        ValueError: not ``host:port``, ``ray://host:port`` or ``auto``.
        ConnectionError: no TCP connection within ``CONNECT_TIMEOUT_S``.
    """
    import socket
    import tempfile
    from pathlib import Path

    said = address
    if address == "auto":
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        address = os.environ.get("RAY_ADDRESS") or (current.read_text().strip() if current.is_file() else "")
        if not address or address == "auto":
            return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address={said!r} is not a Ray cluster address; expected host:port (e.g. "
                         "10.0.0.5:6379), ray://host:port or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        where = "" if said == address else f" (which names {address})"
        raise ConnectionError(f"no Ray cluster answers at address={said!r}{where}: {err or type(err).__name__}; "
                              "expected the head node's host:port of a running cluster (`ray start --head` "
                              "prints it)") from err


def _model_source(model: Any) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """``(source, dtype name, fingerprint)`` for the workers: None for the packaged MiniLM, so that each
    node resolves its own install; a local directory made absolute; a ``HeadedModel``'s fingerprint."""
    from pathlib import Path

    from headlab.models import HeadedModel

    if isinstance(model, HeadedModel):
        from headlab.capture._shards import model_fingerprint
        from headlab.models.loading import default_model_path

        dtype = str(model.dtype).removeprefix("torch.")
        try:
            packaged = model.source == str(default_model_path())
        except ModuleNotFoundError:
            packaged = False
        return None if packaged else model.source, dtype, model_fingerprint(model)
    if model is None:
        return None, None, None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a checkpoint directory, a hub id, None or a HeadedModel; got "
                        f"{type(model).__name__}")
    path = Path(model).expanduser()
    return (str(path.resolve()) if path.exists() else os.fspath(model)), None, None
