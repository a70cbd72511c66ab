"""kill -9 of a run's whole process group (wandb's writer included), then resume: the train/* and val/* rows of all
segments together equal the straight run's, step by step, read back from the offline files; no temp folder is
left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from checkpoints.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
# A checkpoint every 4 steps; the kill lands at step 10, after the save of step 8 and before that of 12.
ARGS = ["--trainer.max_steps", "12", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2",
        "--checkpoint.every_n_train_steps", "4", "--samples.every_n_steps", "4", "--samples.max_new_tokens", "8",
        "--attention_maps.every_n_steps", "0", "--trainer.log_every_n_steps", "4"]  # fmt: skip
KILL_AT = 10
WALL_CLOCK = ("train/tokens_per_s", "train/mfu")


def kept_rows(run_dir: Path, wandb_history) -> tuple[list[dict[int, dict]], dict[int, dict]]:
    """({step: train/* and val/* values} of each segment, oldest first; all segments together). Each point is in
    one segment only: a step trained again after the resume is not logged twice."""
    per_segment = []
    for segment in sorted((run_dir / "wandb").glob("offline-run-*")):
        rows = {}
        for row in wandb_history(segment):
            kept = {key: value for key, value in row.items() if key.startswith(("train/", "val/"))}
            if kept:
                rows.setdefault(row["trainer/global_step"], {}).update(kept)
        per_segment.append(rows)
    together: dict[int, dict] = {}
    for rows in per_segment:
        for step, row in rows.items():
            twice = set(together.get(step, {})) & set(row)
            assert not twice, f"step {step}: {sorted(twice)} logged in two segments"
            together.setdefault(step, {}).update(row)
    return per_segment, together


def same_points(together: dict[int, dict], expected: dict[int, dict]) -> None:
    """The same keys at every step (throughput included), with the same values but the wall-clock ones."""
    assert {step: sorted(row) for step, row in together.items()} == {
        step: sorted(row) for step, row in expected.items()
    }

    def values(rows: dict[int, dict]) -> dict[int, dict]:
        return {step: {k: v for k, v in row.items() if k not in WALL_CLOCK} for step, row in rows.items()}

    assert values(together) == values(expected)


def test_wandb_is_not_imported_while_the_run_is_set_up(tiny_args, tmp_path):
    # Its import makes two temp folders (media, artifacts) that only its exit handler removes: imported before the
    # writer's own TMPDIR is in place (in fit, under the run's lock), a kill -9 leaves them in the system one.
    args = tiny_args(tmp_path)[2:]  # without "train.py fit": GPTCLI(run=False) parses and instantiates only
    code = (
        "import sys; from data.datamodule import TextDataModule; from training import LitGPT; "
        "from training.cli import GPTCLI; from training.callback_rules import loggers_of; "
        "from training.wandb_logger import RunWandbLogger; "
        f"cli = GPTCLI(LitGPT, TextDataModule, run=False, args={args!r}); "
        "assert loggers_of(cli.trainer, RunWandbLogger), 'the run has its wandb logger'; print('wandb' in sys.modules)"
    )
    env = {**os.environ, "WANDB_MODE": "offline"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "False"


@pytest.mark.slow
def test_a_resume_after_kill_9_relogs_what_the_killed_segment_lost(
    tiny_args, script, tmp_path, wandb_history, monkeypatch, request
):
    # A short system temp folder, as /tmp is: the run's own temp folder in it then holds multiprocessing's
    # sockets too (pytest's deep tmp_path would keep those in the system folder: checkpoints/run_lock.py).
    temp = Path(tempfile.mkdtemp(prefix="sys-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(temp)}
    pause = {"class_path": "tests.training.pause_at_step.PauseAtStep", "init_args": {"step": KILL_AT}}
    args = tiny_args(tmp_path / "killed", *ARGS, f"--trainer.callbacks+={json.dumps(pause)}")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, start_new_session=True)  # fmt: skip
    assert any("paused at step" in line for line in proc.stdout), "the run never paused"
    os.killpg(proc.pid, signal.SIGKILL)  # the group: wandb's writer dies too, as on a lost node
    proc.wait(timeout=60)
    run_dir = tmp_path / "killed" / "tiny"
    monkeypatch.setattr(
        tempfile, "tempdir", str(temp)
    )  # the run's own temp folder is named in the system one
    run_temp = RunDir(run_dir).temp
    tables = list(temp.rglob("*.table.json"))
    assert tables and all(run_temp in table.parents for table in tables), (
        f"the killed run's tables were not (all) in the run's temp folder {run_temp}: {tables}"
    )

    resume = subprocess.run([sys.executable, *tiny_args(tmp_path / "killed", *ARGS, "--ckpt_path", "last")],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    # wandb's import-time media and artifact folders went into the run's temp folder, which the resume emptied.
    assert not [entry.name for entry in temp.iterdir() if "wandb" in entry.name]
    script(*tiny_args(tmp_path / "straight", *ARGS))

    per_segment, together = kept_rows(run_dir, wandb_history)
    # The killed segment is gone when wandb had written none of its rows: the resume removes an empty segment.
    assert len(per_segment) in (1, 2), per_segment
    killed = per_segment[0] if len(per_segment) == 2 else {}
    _, expected = kept_rows(tmp_path / "straight" / "tiny", wandb_history)
    assert sorted(expected) == [4, 8, 12] and all("val/loss" in expected[step] for step in expected)
    assert set(killed) != {4, 8}, "the killed segment lost nothing: this test no longer exercises the re-log"
    assert not any(key.startswith("val/") for key in killed.get(4, {})), "no val/* row to re-log"
    # Step 8's validation ran after the step-8 checkpoint was saved, so no checkpoint holds its values: the
    # resume, which starts at step 9, validates step 8 again.
    assert not any(key.startswith("val/") for key in killed.get(8, {})), "no val/* row of step 8 to recompute"
    same_points(
        together, expected
    )  # every train/* and val/* point, once, at its step, with the straight run's value
    assert "re-logged the train/* and val/* rows" in resume.stderr
    assert "validating step 8 again" in resume.stderr
    # Nothing of the killed run is left in the system temp folder or the run's own (wandb's tables included).
    assert not list(temp.rglob("*.table.json")) and not list(temp.rglob("pymp-*"))
    assert not run_temp.exists()


def summary_keys(run_dir: Path) -> set[str]:
    from common.library_internals import wandb_records
    from training.wandb_history import segments

    return {key for path in segments(run_dir) for kind, record in wandb_records(path) if kind == "summary"
            for key in record}  # fmt: skip


@pytest.mark.slow
def test_a_kill_9_after_the_last_checkpoint_resumes_to_the_whole_history_and_score(
    tiny_args, script, tmp_path, wandb_history, request
):
    # The save of step 12 (max_steps) comes before the last validation; the kill lands inside that validation.
    temp = Path(tempfile.mkdtemp(prefix="sys-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(temp)}
    pause = {"class_path": "tests.training.pause_at_step.PauseInValidation", "init_args": {"step": 12}}
    args = tiny_args(tmp_path / "killed", *ARGS, f"--trainer.callbacks+={json.dumps(pause)}")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, start_new_session=True)  # fmt: skip
    assert any("paused at step 12 (validating)" in line for line in proc.stdout), "the run never paused"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    run_dir = tmp_path / "killed" / "tiny"
    assert any(entry.name.startswith("gqa-run-") for entry in temp.iterdir()), (
        "the killed run left no temp folder"
    )

    resume = subprocess.run([sys.executable, *tiny_args(tmp_path / "killed", *ARGS, "--ckpt_path", "last")],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert "nothing to train" in resume.stderr and "validating step 12 again" in resume.stderr
    script(*tiny_args(tmp_path / "straight", *ARGS))

    _, together = kept_rows(run_dir, wandb_history)
    _, expected = kept_rows(tmp_path / "straight" / "tiny", wandb_history)
    assert "val/loss" in expected[12]
    same_points(together, expected)
    assert {"val/text_bpb", "val/nats_per_char"} <= summary_keys(run_dir)
    # (torch.compile's cache stays in the system temp folder, on purpose: checkpoints/run_lock.py)
    assert not list(temp.glob("gqa-run-*")), "the killed run's temp folder was left behind"

    # Resumed once more, nothing is lost: it says so, logs nothing, and leaves no new segment.
    before = sorted(path.name for path in (run_dir / "wandb").glob("offline-run-*"))
    again = subprocess.run([sys.executable, *tiny_args(tmp_path / "killed", *ARGS, "--ckpt_path", "last")],
                           cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert again.returncode == 0 and "nothing to train" in again.stderr, again.stderr[-3000:]
    assert "again" not in again.stderr and "scoring" not in again.stderr
    assert sorted(path.name for path in (run_dir / "wandb").glob("offline-run-*")) == before


def test_segments_without_a_row_are_removed_and_the_others_kept(tiny_run, tmp_path):
    from training.wandb_history import history_rows, remove_empty_segments, segments

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run / "wandb", run_dir / "wandb", symlinks=True)
    (kept,) = segments(run_dir)
    killed = run_dir / "wandb" / "offline-run-20261207_000000-abcdefgh"
    killed.mkdir()
    # A start killed before its first row: the file's header written, no history record.
    (killed / "run-abcdefgh.wandb").write_bytes(kept.read_bytes()[:7])
    assert next(history_rows(killed / "run-abcdefgh.wandb"), None) is None
    said = []
    remove_empty_segments(run_dir, said.append)
    assert segments(run_dir) == [kept] and not killed.exists()
    assert said == ["wandb: removed 1 empty segment(s) of starts killed before their first row"]
