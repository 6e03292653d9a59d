"""The Ray engine: shards cut from capture's own batches, merged results equal to one process,
a killed worker retried, a failing shard named, and the error without Ray.

One local Ray serves the module; one engine of 2 workers serves every test that does not need
its own (the Ray has a third CPU for those). Workers load the tiny BERT from a checkpoint
directory, as they would a user's.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headlab
from headlab import heads
from headlab.analysis import HeadSimilarity, SurfaceStats, TaxonomyStats
from headlab.capture import MeanZ, capture, plan_batches
from headlab.capture._shards import pack, unpack
from headlab.capture.distributed import INSTALL, RayEngine, ShardError, plan_shards, sharded_capture
from headlab.models import HeadedModel
from tests.support.text import TEXTS, fake_tokenizer
from tests.support.tiny import pruned_bert

WORDS = ["the", "cat sat", "a big red dog ran on a mat", "on the mat, a cat"]
CORPUS = [f"{text} {tail}" for text in TEXTS for tail in WORDS] * 2  # 64 items
OPTIONS = {"take": ("pattern", "z"), "batch_tokens": 64}  # about 20 batches


# ---- shards: whole batches of capture's plan, so a worker's batches are the single-process ones


@given(st.lists(st.integers(1, 40), min_size=1, max_size=120), st.integers(1, 12),
       st.sampled_from([(64, 8), (100, None), (None, 5)]))
def test_shards_are_contiguous_whole_batches_that_replan_to_themselves(lengths, n, bounds):
    batch_tokens, max_batch_size = bounds
    whole = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    shards = plan_shards(lengths, shards=n, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    assert len(shards) == min(n, len(whole)) and all(s.batches >= 1 for s in shards)
    assert sorted(i for s in shards for i in s.items) == list(range(len(lengths)))
    start = 0
    for k, shard in enumerate(shards):
        assert (shard.index, shard.count, shard.first_batch) == (k, len(shards), start)
        own = whole[start:start + shard.batches]
        assert shard.items == tuple(sorted(i for b in own for i in b))
        # what a worker does: re-plan the shard's items in corpus order, with the same bounds
        local = plan_batches([lengths[i] for i in shard.items], batch_tokens=batch_tokens,
                             max_batch_size=max_batch_size)
        assert [[shard.items[i] for i in b] for b in local] == own
        start += shard.batches
    assert start == len(whole)


def test_shards_balance_their_cost():
    lengths = [5 + (i * 37) % 60 for i in range(2000)]
    shards = plan_shards(lengths, shards=8, batch_tokens=512)
    cost = [s.padded_tokens for s in shards]
    assert len(shards) == 8 and max(cost) < 1.6 * min(cost)  # pos-weighted: long shards hold fewer tokens
    assert shards[0].tokens < shards[-1].tokens


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_shards_refuse_a_bad_count(bad):
    with pytest.raises(ValueError, match="shards="):
        plan_shards([3, 4], shards=bad)


# ---- without Ray


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'headlab\[ray\]'") as info:
        sharded_capture(None, ["a text"], consumers=lambda shard: [SurfaceStats()])
    assert INSTALL in str(info.value)
    with pytest.raises(ImportError, match=r"headlab\[ray\]"):
        RayEngine()


class _TaskError(Exception):  # Ray's RayTaskError: the worker's exception is its cause
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@pytest.mark.parametrize("version", [(3, 10, 14), (3, 11, 0)])
def test_a_workers_setup_error_is_raised_as_itself(monkeypatch, version):
    # Exception.add_note is Python 3.11's: on 3.10 the worker's own exception still goes up, without the note.
    import types

    import headlab.capture.distributed as distributed

    monkeypatch.setattr(distributed, "sys", types.SimpleNamespace(version_info=version))
    cause = ValueError("not a checkpoint")

    def get(refs):
        raise _TaskError(cause)

    engine = object.__new__(RayEngine)  # the engine's setup path alone: no Ray started
    engine.ray = types.SimpleNamespace(get=get, exceptions=types.SimpleNamespace(RayTaskError=_TaskError))
    engine.source = "my/model"
    with pytest.raises(ValueError, match="not a checkpoint") as info:
        engine._get([])
    assert info.value is cause
    assert getattr(cause, "__notes__", []) == (
        ["(raised on a Ray worker loading the model 'my/model')"] if version >= (3, 11) else [])


def test_a_structure_that_merges_itself_is_merged_whole_and_a_list_one_by_one():
    from headlab.capture._shards import merges_itself
    from headlab.capture.distributed import _merge

    class Named:
        """Holds its accumulators by name (as analyze's PassAccumulators), iterates over them, merges itself."""

        def __init__(self):
            self.surface, self.merged = SurfaceStats(), []

        def __iter__(self):
            return iter([self.surface])

        def merge(self, other):
            self.merged.append(other)
            return self

    first, second = Named(), Named()
    assert merges_itself(first) and not merges_itself([SurfaceStats()]) and not merges_itself((SurfaceStats(),))
    assert _merge(None, first) is first and _merge(first, second) is first and first.merged == [second]
    held = _merge(None, (SurfaceStats(), MeanZ()))
    assert isinstance(held, list) and _merge(held, [SurfaceStats(), MeanZ()]) is held
    with pytest.raises(TypeError, match="returned 1 accumulators for one shard and 2 for another"):
        _merge(held, [SurfaceStats()])


# ---- what a shard sends back: plain tensors travel as numpy arrays, the rest as torch pickles them


_ARRAY_DTYPES = [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool, torch.complex64, torch.complex128]


@given(st.sampled_from(_ARRAY_DTYPES), st.lists(st.integers(0, 4), min_size=1, max_size=3), st.booleans(),
       st.integers(0, 2**31))
def test_a_plain_tensor_comes_back_equal_and_travels_as_an_array(dtype, shape, transpose, seed):
    pytest.importorskip("ray")
    generator = torch.Generator().manual_seed(seed)
    tensor = (torch.randn(shape, generator=generator, dtype=torch.float64) * 50).to(dtype)
    if transpose and tensor.dim() >= 2:
        tensor = tensor.transpose(0, -1)  # not contiguous
    blob = pack({"sums": tensor, "view": tensor[..., :1], "count": torch.tensor(7)})
    assert b"_rebuild_tensor" not in blob  # torch's storage pickling is the slow path this avoids
    back = unpack(blob)
    assert back["count"].shape == () and back["count"].dtype == torch.int64 and int(back["count"]) == 7
    for got, sent in ((back["sums"], tensor), (back["view"], tensor[..., :1])):
        assert type(got) is torch.Tensor and got.dtype == sent.dtype and got.shape == sent.shape
        assert torch.equal(got, sent)
    back["sums"].zero_()  # writable, and its own memory: the view came back as a tensor of its own
    assert torch.equal(back["view"], tensor[..., :1])


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.rand(3)),  # a subclass, and autograd
    lambda: torch.rand(3, requires_grad=True),
    lambda: torch.rand(3, dtype=torch.bfloat16),  # numpy has no bfloat16
    lambda: torch.rand(3, dtype=torch.complex64).conj(),  # a conjugate view numpy cannot share
])
def test_other_tensors_keep_torchs_own_pickling(make):
    pytest.importorskip("ray")
    tensor = make()
    blob = pack(tensor)
    assert b"_rebuild" in blob
    back = unpack(blob)
    assert type(back) is type(tensor) and back.dtype == tensor.dtype
    assert back.requires_grad == tensor.requires_grad and back.is_conj() == tensor.is_conj()
    assert torch.equal(back.detach().resolve_conj(), tensor.detach().resolve_conj())


def test_packed_accumulators_give_the_same_results(checkpoint):
    pytest.importorskip("ray")
    consumers, _ = _single_process(checkpoint, CORPUS[:12])
    back = unpack(pack(consumers))
    for ours, theirs in zip(back[:2], consumers[:2]):
        a, b = ours.result(), theirs.result()
        assert a.heads == b.heads
        for name in a.columns:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(back[2].result().distances, consumers[2].result().distances)
    for layer, mean in consumers[3].result().items():
        assert torch.equal(back[3].result()[layer], mean)


# ---- on a local Ray


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                                     unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    model = pruned_bert(len(tokenizer))
    return heads.save(HeadedModel(model=model, tokenizer=tokenizer, source="tiny"), tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(ray_local, checkpoint):
    with RayEngine(checkpoint, workers=2) as engine:
        yield engine


def accumulators(shard):
    """Every accumulator kind; the similarity sample is seeded per batch of the whole corpus."""
    similarity = HeadSimilarity(row_fraction=0.1)
    similarity.batches_seen = shard.first_batch
    return [SurfaceStats(), TaxonomyStats(), similarity, MeanZ()]


class _Whole:
    first_batch = 0


def _single_process(checkpoint, corpus=CORPUS):
    consumers = accumulators(_Whole())
    run = capture(headlab.load(checkpoint), corpus=corpus, consumers=consumers, progress=False, **OPTIONS)
    return consumers, run


def _assert_equal(merged, single):
    surface, taxonomy, similarity, means = merged
    for ours, theirs in ((surface, single[0]), (taxonomy, single[1])):
        a, b = ours.result(), theirs.result()
        assert a.heads == b.heads and list(a.columns) == list(b.columns)
        for name in a.columns:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=1e-12, err_msg=name)
    a, b = similarity.result(), single[2].result()
    assert a.heads == b.heads and a.rows == b.rows
    np.testing.assert_allclose(a.distances, b.distances, rtol=1e-12, atol=1e-12)
    a, b = means.result(), single[3].result()
    assert sorted(a) == sorted(b)
    for layer in a:
        torch.testing.assert_close(a[layer], b[layer], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shards", [2, 5])
def test_merged_results_equal_one_process(engine, checkpoint, shards):
    single, expected = _single_process(checkpoint)
    run = engine.run(CORPUS, consumers=accumulators, shards=shards, progress=shards == 5, **OPTIONS)
    _assert_equal(run.consumers, single)
    assert [r.shard.index for r in run.shards] == list(range(shards))
    assert len({r.worker for r in run.shards}) == 2  # both workers took shards
    got = run.capture
    assert (got.items, got.tokens, got.padded_tokens, got.batches, got.layers, got.take, got.max_length) == (
        expected.items, expected.tokens, expected.padded_tokens, expected.batches, expected.layers, expected.take,
        expected.max_length)
    for consumer in run.consumers:  # working buffers stay on the workers: what came back is sums
        assert len(pickle.dumps(consumer)) < 100_000


def test_truncated_items_are_reported_with_corpus_indices(engine):
    long = " ".join(["the cat sat on the mat"] * 8)  # 50 pieces; every item of TEXTS has at most 23
    corpus = [*TEXTS[:3], long, *TEXTS[3:], long]
    with pytest.warns(UserWarning, match="2 of 10 inputs are longer than max_length=40"):
        run = engine.run(corpus, consumers=accumulators, max_length=40, take=OPTIONS["take"], progress=False)
    assert run.capture.truncated == [3, 9] and run.capture.max_length == 40


def test_a_shard_that_raises_is_named(engine):
    class Refuse:
        """Refuses any batch holding the word "mat," (with its comma)."""

        def update(self, batch):
            if any("mat," in text for text in batch.texts):
                raise ValueError("a bad item")

        def merge(self, other):
            return self

    corpus = [text.replace(",", "") for text in CORPUS]
    corpus[40] = "the cat sat on the mat, badly"
    named = r"shard \d+ of 4 \(batches \d+–\d+ of the length-sorted plan; \d+ items, corpus indices .*\) failed"
    with pytest.raises(ShardError, match=named + ": ValueError: a bad item") as info:
        engine.run(corpus, consumers=lambda shard: [Refuse()], shards=4, batch_tokens=64, progress=False)
    assert 40 in info.value.shard.items and not info.value.worker_died
    assert isinstance(info.value.cause, ValueError)


def test_a_selection_the_model_lacks_fails_once_as_capture_would(engine):
    from headlab.heads import Heads

    with pytest.raises(ValueError, match="7") as info:
        engine.run(CORPUS[:4], consumers=accumulators, heads=Heads(layers=[7]), progress=False)
    assert not isinstance(info.value, ShardError)


def test_a_consumer_without_merge_is_refused(engine):
    class NoMerge:
        def update(self, batch):
            pass

    with pytest.raises(ShardError, match="has no merge"):
        engine.run(CORPUS[:8], consumers=lambda shard: [NoMerge()], progress=False)


def test_a_killed_worker_is_retried_and_the_result_is_unchanged(engine, checkpoint, tmp_path):
    pid_file = tmp_path / "worker.pid"

    class WaitToBeKilled:
        """In shard 1's first attempt: tells the test its worker's pid, then waits to be killed."""

        def __init__(self, shard):
            self.shard = shard

        def update(self, batch):
            if self.shard.index == 1 and not pid_file.exists():
                (tmp_path / "pid.tmp").write_text(str(os.getpid()))
                (tmp_path / "pid.tmp").rename(pid_file)
                time.sleep(120)  # SIGKILLed long before

        def merge(self, other):
            return self

    def factory(shard):
        return [*accumulators(shard), WaitToBeKilled(shard)]

    killed = []

    def kill_the_worker():  # from outside, as the kernel's OOM killer or an operator would
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if pid_file.exists():
            killed.append(int(pid_file.read_text()))
            os.kill(killed[0], signal.SIGKILL)

    single, _ = _single_process(checkpoint)
    killer = threading.Thread(target=kill_the_worker, daemon=True)
    killer.start()
    run = engine.run(CORPUS, consumers=factory, shards=3, progress=False, **OPTIONS)
    killer.join()
    assert killed and killed[0] != os.getpid()  # a worker process was killed mid-shard
    assert run.shards[1].worker.rsplit(":", 1)[1] != str(killed[0])  # a restarted worker redid shard 1
    _assert_equal(run.consumers[:4], single)
    assert [r.shard.index for r in run.shards] == [0, 1, 2]


@pytest.mark.filterwarnings("ignore:.*CPUs are free")
def test_a_worker_that_keeps_dying_fails_its_shard_by_name(ray_local, checkpoint):
    class Die:
        def update(self, batch):
            os._exit(1)

        def merge(self, other):
            return self

    with RayEngine(checkpoint, workers=1, max_retries=0) as engine, pytest.raises(ShardError) as info:
        engine.run(CORPUS[:8], consumers=lambda shard: [Die()], progress=False)
    assert info.value.worker_died and "shard 0 of 1" in str(info.value)
    assert "worker process died, and kept dying through max_retries=0 restarts" in str(info.value)


@pytest.mark.filterwarnings("ignore:.*CPUs are free")
def test_a_model_changed_in_memory_is_refused(ray_local, checkpoint):
    loaded = headlab.load(checkpoint)
    heads.scale(loaded, {0: [1]}, 0.5)
    with RayEngine(loaded, workers=1) as engine, pytest.raises(ValueError, match="differs from the one workers load"):
        engine.run(CORPUS[:4], consumers=accumulators, progress=False)


@pytest.mark.filterwarnings("ignore:.*CPUs are free")  # the engine before released its CPU a moment ago
def test_a_model_the_workers_cannot_load_raises_the_loaders_error(ray_local, tmp_path):
    with RayEngine(tmp_path / "missing", workers=1) as engine, pytest.raises(FileNotFoundError, match="missing"):
        engine.run(CORPUS[:4], consumers=accumulators, progress=False)


@pytest.mark.parametrize("options, match", [
    ({"workers": 0}, "workers=0"), ({"threads_per_worker": 0}, "threads_per_worker=0"),
    ({"max_retries": -1}, "max_retries=-1"), ({"workers": 4}, "needs 4 CPUs; the Ray cluster has 3"),
])
def test_bad_engine_options_are_refused(ray_local, checkpoint, options, match):
    with pytest.raises(ValueError, match=match):
        RayEngine(checkpoint, **options)


# ---- joining a cluster: an address where nothing listens is refused at once, not after Ray's retries


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_listens_is_refused_at_once(monkeypatch):
    from headlab.capture.distributed import check_address

    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at address='127.0.0.1:{port}'"):
        check_address(f"127.0.0.1:{port}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match=rf"address='auto' \(which names 127.0.0.1:{port}\)"):
        check_address("auto")
    assert time.monotonic() - start < 5
    with pytest.raises(ValueError, match="address='nonsense' is not a Ray cluster address; expected host:port"):
        check_address("nonsense")


def test_a_local_ray_of_more_workers_than_the_machine_has_cpus_is_warned(monkeypatch):
    ray = pytest.importorskip("ray")
    from headlab.capture import distributed

    class StopError(Exception):
        pass

    def init(**kwargs):
        raise StopError(kwargs["num_cpus"])

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(distributed.os, "cpu_count", lambda: 2)
    with pytest.warns(RuntimeWarning, match=r"workers=8 × threads_per_worker=1 asks for 8 CPUs of this machine's 2: "
                                            r".* pass workers=2 \(--workers 2\) or fewer"), pytest.raises(StopError):
        RayEngine(None, workers=8)
    with warnings.catch_warnings():  # as many as fit: no warning (an error here)
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(StopError, match=r"^2$"):
            RayEngine(None, workers=2)
