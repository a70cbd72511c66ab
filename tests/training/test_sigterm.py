"""SIGTERM mid-run: a checkpoint is saved, the exit code is non-zero, and resuming matches a straight run."""

from __future__ import annotations

import signal
import time

import torch

QUIET = ["--trainer.logger", "false", "--samples.every_n_steps", "0", "--attention_maps.every_n_steps", "0",
         "--trainer.max_steps", "24", "--checkpoint.every_n_train_steps", "3", "--trainer.limit_val_batches", "0"]


def final_weights(run_dir):
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 24
    return ckpt["state_dict"]


def test_sigterm_saves_then_resume_matches_uninterrupted(script, start_script, tiny_args, tmp_path):
    proc = start_script(*tiny_args(tmp_path / "stopped", *QUIET))
    last = tmp_path / "stopped" / "tiny" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "training ended before it could be interrupted:\n" + proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    assert "SIGTERM" in stderr
    stopped_at = torch.load(last, weights_only=True)["global_step"]
    assert 3 <= stopped_at < 24

    script(*tiny_args(tmp_path / "stopped", *QUIET, "--ckpt_path", "last"))
    script(*tiny_args(tmp_path / "straight", *QUIET))
    resumed, straight = final_weights(tmp_path / "stopped" / "tiny"), final_weights(tmp_path / "straight" / "tiny")
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), name
