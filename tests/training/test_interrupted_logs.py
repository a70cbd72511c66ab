"""SIGTERM during a validation, then resume: the logged val/loss steps equal a straight run's, and the samples
table after the resume still holds the rows logged before it (read back from the offline wandb files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUE = "paused at step"
# Validation every 4 steps; periodic saving off, so only the stop can write the checkpoint the resume uses.
ARGS = ["--trainer.max_steps", "12", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "4",
        "--checkpoint.every_n_train_steps", "1000", "--samples.every_n_steps", "4", "--samples.max_new_tokens", "8",
        "--attention_maps.every_n_steps", "0", "--trainer.log_every_n_steps", "4"]  # fmt: skip
PAUSE = {"class_path": "tests.training.pause_at_step.PauseInValidation", "init_args": {"step": 8}}

pytestmark = pytest.mark.slow


def segments(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))  # names start with the start time


def logged_steps(history: list[dict], key: str) -> list[tuple[int, float]]:
    return [(row["trainer/global_step"], row[key]) for row in history if key in row]


@pytest.fixture(scope="module")
def runs(tiny_args, script, tmp_path_factory) -> tuple[Path, Path]:
    """(interrupted then resumed run, straight run) folders."""
    root = tmp_path_factory.mktemp("interrupted")
    args = tiny_args(root / "stopped", *ARGS, f"--trainer.callbacks+={json.dumps(PAUSE)}")
    with open(root / "stderr.txt", "w+") as stderr_file:  # a file: a chatty stderr cannot block the run
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr_file,
                                text=True, env=dict(os.environ))  # fmt: skip
        cue = next((line for line in proc.stdout if CUE in line), None)
        assert cue is not None, "never paused:\n" + (root / "stderr.txt").read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    assert proc.returncode == 143, stderr[-2000:]
    script(*tiny_args(root / "stopped", *ARGS, "--ckpt_path", "last"))
    script(*tiny_args(root / "straight", *ARGS))
    return root / "stopped" / "tiny", root / "straight" / "tiny"


def test_sigterm_during_validation_loses_no_val_loss_point(runs, wandb_history):
    stopped, straight = runs
    parts = segments(stopped)
    assert len(parts) == 2
    resumed = [point for part in parts for point in logged_steps(wandb_history(part), "val/loss")]
    expected = logged_steps(wandb_history(segments(straight)[0]), "val/loss")
    assert [step for step, _ in expected] == [4, 8, 12]
    assert [step for step, _ in resumed] == [4, 8, 12]
    # The resume is bit-exact, so the values agree too.
    assert [value for _, value in resumed] == pytest.approx([value for _, value in expected])


def last_table(segment: Path, wandb_history) -> list[list]:
    paths = [row["samples/path"] for row in wandb_history(segment) if "samples/path" in row]
    return json.loads((segment / "files" / paths[-1]).read_text(encoding="utf-8"))["data"]


def test_samples_table_after_a_resume_holds_the_rows_of_before(runs, wandb_history):
    stopped, straight = runs
    after_resume = last_table(segments(stopped)[-1], wandb_history)
    assert [row[0] for row in after_resume] == [4, 4, 4, 8, 8, 8, 12, 12, 12]
    assert after_resume == last_table(segments(straight)[0], wandb_history)
