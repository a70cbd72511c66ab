"""Checkpoints under kill -9: a SIGKILL at every phase of a save, corrupt files, a full disk, stale temp files.

The killed runs are `python -m tests.training.chaos_worker` subprocesses (tiny model, a checkpoint every step); one
uninterrupted run of it is the reference every resumed chain must reproduce bit for bit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoints.atomic_io import FAULT_ENV, PHASES
from common.files import stale_temp_files

pytestmark = pytest.mark.slow  # train.py runs in subprocesses here

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.training.chaos_worker"  # tiny model, a checkpoint every step
STEPS = 10
SHM = Path("/dev/shm")


def run_worker(corpus, cache, run_dir, *flags, fault=None, env=None, expect_kill=False):
    """Run ckpt_worker.py; `fault` is "<phase>@<save number>"; returns the CompletedProcess."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environ.pop(FAULT_ENV, None)
    if fault:
        environ[FAULT_ENV] = fault
    result = subprocess.run(
        [sys.executable, "-m", WORKER, "--corpus", str(corpus), "--cache", str(cache), "--run_dir",
         str(run_dir), "--steps", str(STEPS), "--n_layer", "2", "--n_embd", "32", *flags],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    expected = -9 if expect_kill else 0
    assert result.returncode == expected, f"{fault}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".partial-" in p.name or ".staging-" in p.name]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(corpus, data_cache, tmp_path_factory) -> Path:
    """One uninterrupted 10-step run: its final weights are the reference, its checkpoints the corruption fodder."""
    run_dir = tmp_path_factory.mktemp("straight")
    run_worker(corpus, data_cache, run_dir)
    return run_dir


@pytest.fixture
def shm_tmpdir(tmp_path):
    """A system temp directory on another filesystem than the run directory (tmpfs vs disk)."""
    if not SHM.is_dir() or SHM.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a different filesystem than the test's run directory")
    folder = Path(subprocess.check_output(["mktemp", "-d", "-p", str(SHM)], text=True).strip())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_kill_at_every_save_phase_resumes_to_the_uninterrupted_weights(
    corpus, data_cache, tmp_path, straight, shm_tmpdir
):
    """One chain of runs, each SIGKILLed at its 2nd save in the next phase (sync and async alternating)."""
    run_dir, env = tmp_path / "chain", {"TMPDIR": str(shm_tmpdir)}
    left_temp = []
    for index, phase in enumerate(PHASES):
        flags = (["--resume"] if index else []) + (["--async"] if index % 2 else [])
        result = run_worker(
            corpus, data_cache, run_dir, *flags, fault=f"{phase}@2", env=env, expect_kill=True
        )
        assert "cannot be resumed" not in result.stderr, f"a kill before {phase} left a corrupt checkpoint"
        left_temp.append(bool(stale_temp_files(run_dir / "checkpoints")))
    result = run_worker(corpus, data_cache, run_dir, "--resume", env=env)
    assert "cannot be resumed" not in result.stderr
    assert "removed 1 temporary checkpoint file" in result.stderr or not left_temp[-1]
    assert left_temp[:3] == [True, True, True]  # the kills mid-save did leave temp files for the sweep
    assert temp_files(run_dir) == []  # ... and each next start swept them
    assert same_weights(torch.load(run_dir / "final.pt"), torch.load(straight / "final.pt"))
    # Nothing of a checkpoint went to the system temp directory (torch.save output is a zip: b"PK").
    assert not [p for p in shm_tmpdir.rglob("*") if p.is_file() and p.read_bytes()[:2] == b"PK"]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step-00000009.ckpt", "step-00000010.ckpt"]  # keep_last 2
    assert (run_dir / "checkpoints" / "last.ckpt").samefile(run_dir / "checkpoints" / "step-00000010.ckpt")


def test_resume_with_dataloader_workers_is_exact(corpus, data_cache, tmp_path, straight):
    """Lightning 2.6 replays the epoch-0 shuffle after a resume with workers; our endless stream restarts at
    the saved batch instead, so a killed run with 2 workers ends with the workers-free reference's weights."""
    run_dir = tmp_path / "workers"
    run_worker(corpus, data_cache, run_dir, "--workers", "2", fault="before_rename@4", expect_kill=True)
    result = run_worker(corpus, data_cache, run_dir, "--workers", "2", "--resume")
    assert "step-00000003.ckpt" in result.stderr  # resumed mid-run, not from scratch
    assert same_weights(torch.load(run_dir / "final.pt"), torch.load(straight / "final.pt"))


def corrupt_copy(straight: Path, tmp_path: Path, damage) -> Path:
    """A copy of the reference run's checkpoints (step 9, step 10 = last.ckpt) with `damage(path)` applied."""
    folder = tmp_path / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("step-00000009.ckpt", "step-00000010.ckpt"):
        shutil.copyfile(straight / "checkpoints" / name, folder / name)
    os.link(folder / "step-00000010.ckpt", folder / "last.ckpt")
    damage(folder)
    return folder


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for offset in range(len(data) // 2, len(data) // 2 + 8):
        data[offset] ^= 0xFF
    path.write_bytes(data)


@pytest.mark.parametrize("damage", [truncate, flip_bytes], ids=["truncated", "bytes-flipped"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(straight, tmp_path, damage):
    from checkpoints.resume import choose_resume_checkpoint

    folder = corrupt_copy(straight, tmp_path, lambda f: damage(f / "step-00000010.ckpt"))
    warnings = []
    assert choose_resume_checkpoint(folder, warn=warnings.append) == folder / "step-00000009.ckpt"
    assert len(warnings) == 1 and "step-00000010.ckpt" in warnings[0] and "\n" not in warnings[0]


def test_fallback_resume_reaches_the_uninterrupted_weights(corpus, data_cache, straight, tmp_path):
    run_dir = tmp_path / "run"
    corrupt_copy(straight, run_dir, lambda f: flip_bytes(f / "step-00000010.ckpt"))
    result = run_worker(corpus, data_cache, run_dir, "--resume")
    assert "cannot be resumed" in result.stderr and "step-00000010.ckpt" in result.stderr
    assert same_weights(torch.load(run_dir / "final.pt"), torch.load(straight / "final.pt"))


def test_when_every_checkpoint_is_corrupt_train_py_says_one_line_and_exits_2(
    straight, tmp_path, script, tiny_args
):
    folder = corrupt_copy(
        straight,
        tmp_path / "runs" / "tiny",
        lambda f: (truncate(f / "step-00000010.ckpt"), flip_bytes(f / "step-00000009.ckpt")),
    )
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = script(*tiny_args(tmp_path / "runs", "--ckpt_path", "last"), check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "warning:"))]
    assert len(errors) == 1 and errors[0].startswith("error:") and "step-00000010.ckpt" in errors[0], errors
    assert "Traceback" not in result.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_kills_at_random_moments_resume_to_the_uninterrupted_weights(corpus, data_cache, tmp_path, straight):
    """The soak that was benchmarks/checkpoint_chaos.py: SIGKILL each segment at a random moment once it has
    saved one or two checkpoints of its own (sync and async saves alternating), resume, and the chain ends with
    the straight run's weights and no temp file left. The moment is counted in checkpoints, not seconds, so a
    fast machine cannot finish a segment before its kill."""
    import random
    import signal
    import time

    from checkpoints.run_dir import step_files

    rng, run_dir = random.Random(0), tmp_path / "soak"
    checkpoints = run_dir / "checkpoints"
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    environ.pop(FAULT_ENV, None)
    command = [sys.executable, "-m", WORKER, "--corpus", str(corpus), "--cache", str(data_cache), "--run_dir",
               str(run_dir), "--steps", str(STEPS), "--n_layer", "2", "--n_embd", "32"]  # fmt: skip
    killed = 0
    for kill in range(3):
        target = max(step_files(checkpoints), default=-1) + rng.randint(1, 2)
        flags = (["--resume"] if kill else []) + (["--async"] if kill % 2 else [])
        process = subprocess.Popen([*command, *flags], cwd=ROOT, env=environ, stderr=subprocess.DEVNULL)
        while process.poll() is None and max(step_files(checkpoints), default=-1) < target:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.01))  # inside the next step or its save
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            killed += 1
        process.wait()
    assert killed >= 2, "the segments finished before their kills: raise STEPS"
    result = run_worker(corpus, data_cache, run_dir, "--resume")
    assert "cannot be resumed" not in result.stderr
    assert temp_files(run_dir) == []
    assert same_weights(torch.load(run_dir / "final.pt"), torch.load(straight / "final.pt"))
