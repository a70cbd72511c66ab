"""Ctrl-C mid-run: last.ckpt at the step reached, exit 130, and the printed resume command ends bit-identical."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from checkpoints.save_on_stop import GracefulCtrlC

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 12
# Periodic checkpoints off (every 1000 > max_steps): only the Ctrl-C save can hold the step reached.
ARGS = ["--trainer.logger", "false", "--samples.every_n_steps", "0", "--attention_maps.every_n_steps", "0",
        "--trainer.max_steps", str(MAX_STEPS), "--checkpoint.every_n_train_steps", "1000",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "true",
        "--trainer.log_every_n_steps", "1"]  # fmt: skip


def start(args: list[str], stderr: Path) -> subprocess.Popen:
    with stderr.open("w") as err:  # a file, not a pipe: a full pipe would block the run
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=dict(os.environ))  # fmt: skip


def wait_for_step(proc: subprocess.Popen, step: int, timeout: float = 240) -> None:
    """Read the plain progress lines (stdout is not a terminal) until `step` has been passed."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        found = re.match(r"step (\d+)/", line)
        if found and int(found.group(1)) >= step:
            return
        assert time.monotonic() < deadline, "no progress line in time"
    raise AssertionError(f"training ended (exit {proc.wait()}) before step {step}")


def final_weights(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    return ckpt["state_dict"]


def test_ctrl_c_saves_the_step_reached_and_the_printed_resume_matches_a_straight_run(
    script, tiny_args, tmp_path
):
    proc = start(tiny_args(tmp_path / "stopped", *ARGS), tmp_path / "stderr.txt")
    wait_for_step(proc, 3)
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    assert proc.wait(timeout=120) == 130, (tmp_path / "stderr.txt").read_text()[-2000:]
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr and "graceful shutdown" not in stderr
    found = re.search(
        r"stopped by Ctrl-C at step (\d+): saved (\S+); resume with: (python train\.py .+)$", stderr, re.M
    )
    assert found, stderr[-2000:]
    step, saved, resume = int(found.group(1)), Path(found.group(2)), shlex.split(found.group(3))
    assert 3 <= step < MAX_STEPS
    assert torch.load(saved, weights_only=True)["global_step"] == step

    # The printed command, as is: no --config, no data or model overrides (the run's config.yaml has them).
    assert resume == ["python", "train.py", "fit", "--ckpt_path", str(tmp_path / "stopped" / "tiny")]
    script(*resume[1:])
    script(*tiny_args(tmp_path / "straight", *ARGS))
    resumed, straight = (
        final_weights(tmp_path / "stopped" / "tiny"),
        final_weights(tmp_path / "straight" / "tiny"),
    )
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), name


class FakeTrainer:
    """What the Ctrl-C handler touches on a Trainer."""

    def __init__(self) -> None:
        self._signal_connector = type("Connector", (), {"received_sigterm": False})()
        self.is_global_zero = True


def test_first_ctrl_c_in_training_asks_lightning_to_stop_at_the_step_boundary(capsys):
    handler, trainer = GracefulCtrlC(), FakeTrainer()
    handler._trainer = trainer
    handler.on_train_start(trainer, None)
    handler._on_sigint(signal.SIGINT, None)
    assert handler.pressed and trainer._signal_connector.received_sigterm
    assert "Ctrl-C again stops at once" in capsys.readouterr().err


@pytest.mark.parametrize("training", [True, False], ids=["second-ctrl-c", "before-training"])
def test_ctrl_c_exits_130_at_once_when_a_second_or_before_training(training, capsys):
    handler, trainer = GracefulCtrlC(), FakeTrainer()
    handler._trainer = trainer
    if training:
        handler.on_train_start(trainer, None)
        handler._on_sigint(signal.SIGINT, None)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as stop:
            handler._on_sigint(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C)")
