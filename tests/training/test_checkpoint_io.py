"""AtomicCheckpointIO in process: rotation, a full disk, a read-only folder, async errors, sweeping, wandb ids."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch

import checkpoints.atomic_io as checkpoint_io_module
from checkpoints.atomic_io import AtomicCheckpointIO, CheckpointSaveError
from checkpoints.background_io import BackgroundCheckpointIO
from checkpoints.run_dir import NoGoodCheckpointError
from checkpoints.settings import resume_last, with_checkpoint_io


def checkpoint(step: int) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((64,), float(step))}}


def saved_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


def test_keep_last_keeps_the_newest_k_and_last_links_the_newest(tmp_path):
    io = AtomicCheckpointIO(keep_last=2)
    for step in (1, 2, 3):
        io.save_checkpoint(checkpoint(step), tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "last.ckpt",
        "step-00000002.ckpt",
        "step-00000003.ckpt",
    ]
    assert (tmp_path / "last.ckpt").samefile(tmp_path / "step-00000003.ckpt")
    io.save_checkpoint(checkpoint(2), tmp_path / "last.ckpt")  # resumed from step 1: step 3 is abandoned
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000002.ckpt"]
    assert saved_step(tmp_path / "last.ckpt") == 2


def test_disk_full_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), tmp_path / "last.ckpt")
    before = (tmp_path / "last.ckpt").read_bytes()

    def full_disk(obj, f):
        f.write(b"PK" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_io_module.torch, "save", full_disk)
    with pytest.raises(CheckpointSaveError) as caught:
        io.save_checkpoint(checkpoint(2), tmp_path / "last.ckpt")
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path) in message and "No space left" in message
    assert (tmp_path / "last.ckpt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000001.ckpt"]  # no temp file


@contextlib.contextmanager
def read_only(folder: Path):
    """Make `folder` unwritable, also for root (chattr +i), or skip."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is unavailable: cannot make a folder read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_read_only_folder_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), tmp_path / "last.ckpt")
    before = (tmp_path / "last.ckpt").read_bytes()
    with read_only(tmp_path), pytest.raises(CheckpointSaveError, match="writable") as caught:
        io.save_checkpoint(checkpoint(2), tmp_path / "last.ckpt")
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)
    assert (tmp_path / "last.ckpt").read_bytes() == before


def test_async_save_errors_surface_at_teardown_and_keep_the_previous(tmp_path, monkeypatch):
    io = BackgroundCheckpointIO(keep_last=2)
    io.save_checkpoint(checkpoint(1), tmp_path / "last.ckpt")
    io.wait()
    monkeypatch.setattr(
        checkpoint_io_module.torch,
        "save",
        lambda obj, f: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
    )
    io.save_checkpoint(checkpoint(2), tmp_path / "last.ckpt")
    with pytest.raises(CheckpointSaveError, match="No space left"):
        io.teardown()
    assert saved_step(tmp_path / "last.ckpt") == 1


def test_async_save_writes_a_snapshot_not_the_live_tensors(tmp_path):
    io = BackgroundCheckpointIO(keep_last=2)
    release, write = threading.Event(), io.inner.save_checkpoint
    io.inner.save_checkpoint = lambda *args: (release.wait(10), write(*args))  # hold the writer back
    state = checkpoint(1)
    io.save_checkpoint(state, tmp_path / "last.ckpt")
    state["state_dict"]["w"].fill_(-1.0)  # the next optimizer step, while the writer has not written yet
    release.set()
    io.teardown()
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]["w"].eq(1.0).all()


def test_sweep_removes_killed_runs_temporary_checkpoint_files(tmp_path):
    from checkpoints.run_lock import own_run_dir

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / ".step-00000004.ckpt.partial-123-abcd1234").write_bytes(b"x" * 1000)
    (checkpoints / "step-00000003.ckpt").write_bytes(b"keep")
    said = []
    with pytest.raises(NoGoodCheckpointError):  # the resume's choice only reads, even when it finds nothing
        resume_last(checkpoints, say=said.append)
    assert len(list(checkpoints.iterdir())) == 2
    own_run_dir(tmp_path, say=said.append).release()  # the run's one writer sweeps, once it holds the lock
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000003.ckpt"]
    assert len(said) == 1 and "temporary checkpoint file" in said[0]


def test_wandb_run_id_is_kept_in_the_run_dir_or_taken_from_the_checkpoint(tmp_path):
    from training.wandb_logger import record_wandb_run_id, wandb_run_id

    first = wandb_run_id(tmp_path / "a")
    assert len(first) == 8 and not (tmp_path / "a").exists(), "nothing is written before the wandb run exists"
    record_wandb_run_id(tmp_path / "a", first)
    assert wandb_run_id(tmp_path / "a") == first != wandb_run_id(tmp_path / "c")
    assert wandb_run_id(tmp_path / "b", fallback="fromckpt") == "fromckpt"


def test_the_trainer_gets_one_checkpoint_io_of_the_settings_whatever_the_plugins_held():
    ours = {"class_path": "checkpoints.atomic_io.AtomicCheckpointIO", "init_args": {"keep_last": 3}}
    for plugins in (None, [], ours, [AtomicCheckpointIO(keep_last=1)], [BackgroundCheckpointIO(keep_last=1)]):
        assert with_checkpoint_io(plugins, keep_last=3, async_save=False) == [ours], plugins
    theirs = {"class_path": "my.TorchCheckpointIO"}  # chosen on purpose: kept, ours not added
    assert with_checkpoint_io([theirs], keep_last=3, async_save=True) == [theirs]
    background = with_checkpoint_io(["other"], keep_last=2, async_save=True)
    assert background == [
        "other",
        {"class_path": "checkpoints.background_io.BackgroundCheckpointIO", "init_args": {"keep_last": 2}},
    ]
