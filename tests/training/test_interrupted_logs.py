"""SIGTERM, then resume: the logged history equals a straight run's, read back from the offline wandb files.

The signal lands at a step's end, halfway through a validation, or while a checkpoint is being saved; after each,
every train/* point sits at the straight run's `trainer/global_step` with its value, val/loss misses no point,
and the samples table after the resume still holds the rows logged before it.
"""

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
STOP_AT = 8  # a logging, validation (and, for "save", checkpoint) step
# Where the SIGTERM lands: the callback of tests/training/pause_at_step.py that holds the run there, and flags.
MOMENTS = {
    "step": ("PauseAtStep", []),
    "validation": ("PauseInValidation", []),
    "save": ("PauseInSave", ["--checkpoint.every_n_train_steps", str(STOP_AT)]),
}
WALL_CLOCK = ("train/tokens_per_s", "train/mfu")  # measured, so their values differ between any two runs

pytestmark = pytest.mark.slow


def segments(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))  # names start with the start time


def logged_steps(history: list[dict], key: str) -> list[tuple[int, float]]:
    return [(row["trainer/global_step"], row[key]) for row in history if key in row]


def train_points(run_dir: Path, wandb_history) -> list[tuple[int, dict]]:
    """(step, {train/* key: value}) of every row with a train/* key, over all segments in order; wall-clock
    metrics keep their key but not their value."""
    points = []
    for part in segments(run_dir):
        for row in wandb_history(part):
            train = {key: None if key in WALL_CLOCK else value for key, value in row.items()
                     if key.startswith("train/")}  # fmt: skip
            if train:
                points.append((row["trainer/global_step"], train))
    return points


def stop_and_resume(tiny_args, script, root: Path, moment: str) -> Path:
    """Run until the SIGTERM lands at `moment` of step STOP_AT (exit 143), then resume; the run folder."""
    name, extra = MOMENTS[moment]
    pause = {"class_path": f"tests.training.pause_at_step.{name}", "init_args": {"step": STOP_AT}}
    args = tiny_args(root, *ARGS, *extra, f"--trainer.callbacks+={json.dumps(pause)}")
    with open(root.parent / f"{moment}-stderr.txt", "w+") as stderr_file:  # a chatty stderr cannot block it
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr_file,
                                text=True, env=dict(os.environ))  # fmt: skip
        cue = next((line for line in proc.stdout if CUE in line), None)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    assert cue is not None, "never paused:\n" + stderr[-2000:]
    assert proc.returncode == 143, stderr[-2000:]
    script(*tiny_args(root, *ARGS, *extra, "--ckpt_path", "last"))
    return root / "tiny"


@pytest.fixture(scope="module")
def straight(tiny_args, script, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("straight")
    script(*tiny_args(root, *ARGS))
    return root / "tiny"


@pytest.fixture(scope="module")
def stopped(tiny_args, script, tmp_path_factory):
    """`stopped(moment)`: the folder of a run stopped at `moment` and resumed (each made once)."""
    made: dict[str, Path] = {}

    def run(moment: str) -> Path:
        if moment not in made:
            made[moment] = stop_and_resume(tiny_args, script, tmp_path_factory.mktemp(moment), moment)
        return made[moment]

    return run


@pytest.mark.parametrize("moment", MOMENTS)
def test_train_points_after_a_sigterm_equal_the_straight_runs(moment, stopped, straight, wandb_history):
    resumed, expected = train_points(stopped(moment), wandb_history), train_points(straight, wandb_history)
    assert [step for step, _ in expected] == [4, 8, 12]
    assert len(segments(stopped(moment))) == 2
    # The resume is bit-exact, so the values agree exactly; step by step, key by key.
    assert resumed == expected


def test_sigterm_during_validation_loses_no_val_loss_point(stopped, straight, wandb_history):
    parts = segments(stopped("validation"))
    resumed = [point for part in parts for point in logged_steps(wandb_history(part), "val/loss")]
    expected = logged_steps(wandb_history(segments(straight)[0]), "val/loss")
    assert [step for step, _ in expected] == [4, 8, 12]
    assert [step for step, _ in resumed] == [4, 8, 12]
    assert [value for _, value in resumed] == pytest.approx([value for _, value in expected])


def last_table(segment: Path, wandb_history) -> list[list]:
    paths = [row["samples/path"] for row in wandb_history(segment) if "samples/path" in row]
    return json.loads((segment / "files" / paths[-1]).read_text(encoding="utf-8"))["data"]


def test_samples_table_after_a_resume_holds_the_rows_of_before(stopped, straight, wandb_history):
    after_resume = last_table(segments(stopped("validation"))[-1], wandb_history)
    assert [row[0] for row in after_resume] == [4, 4, 4, 8, 8, 8, 12, 12, 12]
    assert after_resume == last_table(segments(straight)[0], wandb_history)
