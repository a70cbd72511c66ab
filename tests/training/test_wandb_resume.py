"""A resumed train.py run logs to the same wandb run id, with steps continuing (read back from offline files)."""

from __future__ import annotations

import shutil

import torch


def steps(history: list[dict]) -> list[int]:
    return [row["trainer/global_step"] for row in history if "trainer/global_step" in row]


def test_a_resumed_run_logs_to_the_same_wandb_run_with_steps_continuing(
    tiny_run, script, tiny_args, tmp_path, wandb_history
):
    root = tmp_path / "runs"
    shutil.copytree(tiny_run.parent, root)  # a copy: other tests read the session run as it is
    run_dir = root / tiny_run.name
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["wandb_run_id"] == run_id

    script(*tiny_args(root, "--ckpt_path", "last", "--trainer.max_steps", "9", "--trainer.val_check_interval", "3",
                      "--checkpoint.every_n_train_steps", "3", "--samples.every_n_steps", "0",
                      "--attention_maps.every_n_steps", "1"))  # fmt: skip

    segments = sorted((run_dir / "wandb").glob("offline-run-*"))  # names start with the start time
    assert len(segments) == 2
    assert all(
        segment.name.endswith(f"-{run_id}") and (segment / f"run-{run_id}.wandb").is_file()
        for segment in segments
    )
    first, second = (steps(wandb_history(segment)) for segment in segments)
    assert max(first) == 6 and min(second) >= 6 and max(second) == 9, (first, second)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["wandb_run_id"] == run_id


class RecordingLogger:
    """Stands in for WandbLogger under KeptHistory: records what reaches wandb."""

    def __init__(self, save_dir: str) -> None:
        self._save_dir = save_dir
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.logged.append((step, dict(metrics)))


def test_after_a_resume_each_point_reaches_wandb_once(tiny_run):
    from training.wandb_history import KeptHistory, held_logs

    class Logger(KeptHistory, RecordingLogger):
        pass

    held, summary = held_logs(tiny_run)  # read only: the session run is shared
    assert {(5, "train/"), (6, "val/")} <= held and (4, "train/") not in held and "val/text_bpb" in summary
    logger = Logger(str(tiny_run))
    # The checkpoint's rows: step 4's was never written (as after a kill -9), step 5's was.
    logger.restore_train_rows(
        [[4, {"train/loss": 3.0, "epoch": 0.0}], [5, {"train/loss": 2.0, "epoch": 0.0}]]
    )
    assert logger.holds_summary("val/text_bpb")
    # A step trained again after the resume: its points are in the first segment already.
    assert logger.keep_rows(5, {"train/loss": 2.0, "train/tokens_per_s": 9.0, "epoch": 0.0}) == {"epoch": 0.0}
    assert logger.keep_rows(6, {"val/loss": 2.5, "epoch": 0.0}) == {"epoch": 0.0}
    assert logger.keep_rows(7, {"train/loss": 1.5, "epoch": 0.0}) == {"train/loss": 1.5, "epoch": 0.0}
    assert logger.logged == [(4, {"train/loss": 3.0, "epoch": 0.0})]  # the lost row, logged again once
    assert logger.relog_lost() == 0
