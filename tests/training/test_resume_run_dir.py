"""`fit --ckpt_path runs/<run>`: the run's config.yaml first, overrides on top, a finished run exits 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoints.resume import checkpoint_in_run, expand_run_dir_resume
from common.errors import UserError


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "runs" / "tiny"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    return run


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_run_dir_puts_its_config_first_and_keeps_overrides_after_it(run_dir, form, monkeypatch):
    # Which checkpoint file is chosen (and its validation) is tested in test_checkpoint_faults.py.
    monkeypatch.setattr(
        "checkpoints.resume.choose_resume_checkpoint", lambda folder, warn: folder / "last.ckpt"
    )
    ckpt = ["--ckpt_path", str(run_dir)] if form == "separate" else [f"--ckpt_path={run_dir}"]
    args, expanded = expand_run_dir_resume(["fit", *ckpt, "--trainer.max_steps", "9"])
    assert expanded
    assert args == [
        "fit", "--config", str(run_dir / "config.yaml"), "--trainer.default_root_dir", str(run_dir.parent),
        "--run_name", "tiny", "--trainer.max_steps", "9", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"),
    ]  # fmt: skip


def test_validate_reads_a_run_dir_as_fit_does(run_dir, monkeypatch):
    # validate takes the newest readable checkpoint (weights only), the reader's own choice of a folder.
    chosen = run_dir / "checkpoints" / "step-00000006.ckpt"
    monkeypatch.setattr("checkpoints.resume.read_checkpoint", lambda path: ({}, chosen))
    args, expanded = expand_run_dir_resume(
        ["validate", "--config", "configs/tiny.yaml", "--ckpt_path", str(run_dir)]
    )
    assert expanded
    assert args == [
        "validate", "--config", str(run_dir / "config.yaml"), "--trainer.default_root_dir", str(run_dir.parent),
        "--run_name", "tiny", "--config", "configs/tiny.yaml", "--ckpt_path", str(chosen),
    ]  # fmt: skip


@pytest.mark.parametrize("ckpt_path", ["last", "missing/dir", "some.ckpt"])
def test_other_ckpt_paths_are_left_alone(ckpt_path, tmp_path):
    args = ["fit", "--config", "configs/tiny.yaml", "--ckpt_path", ckpt_path]
    assert expand_run_dir_resume(args) == (args, False)


def test_a_directory_without_config_or_checkpoint_is_refused(run_dir):
    (run_dir / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(UserError, match="has no checkpoint to resume"):
        checkpoint_in_run(run_dir)
    (run_dir / "config.yaml").unlink()
    with pytest.raises(UserError, match="without config.yaml"):
        expand_run_dir_resume(["fit", "--ckpt_path", str(run_dir)])


def test_resuming_a_finished_run_says_so_and_exits_0(tiny_run, script):
    last = tiny_run / "checkpoints" / "last.ckpt"
    before, segments = last.stat().st_mtime_ns, sorted((tiny_run / "wandb").iterdir())
    result = script("train.py", "fit", "--ckpt_path", str(tiny_run), check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "nothing to train" in result.stderr and "trainer.max_steps=6" in result.stderr
    assert last.stat().st_mtime_ns == before
    # Its wandb run holds every row and the score already: nothing is validated, scored or logged again.
    assert "again" not in result.stderr and "scoring" not in result.stderr
    assert sorted((tiny_run / "wandb").iterdir()) == segments
    assert torch.load(last, weights_only=True)["global_step"] == 6
