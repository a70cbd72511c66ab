"""train/* and val/* history that survives kill -9, which loses the last rows wandb had not written out: every
checkpoint carries the rows, and a resume re-logs those the run's `.wandb` files do not hold.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from checkpoints.run_dir import RunDir
from common.library_internals import (
    metrics_to_log,
    replace_due_validation,
    restore_due_validation,
    validate_now,
    wandb_records,
)

from .callback_rules import loggers_of

TRAIN_PREFIX = "train/"
KEPT_PREFIXES = (TRAIN_PREFIX, "val/")  # the scalar curves a resume gives back; media are not carried
# In the checkpoint: [[step, {key: value}], ...] of every row with a KEPT_PREFIXES key (the name predates val/*).
HISTORY_KEY = "train_history"
WANDB_ID_KEY = "wandb_run_id"  # in the checkpoint: so a resume without the run directory logs to the same run


def history_rows(wandb_file: Path) -> Iterator[dict]:
    """The history rows of one `.wandb` file, {key: value}, in the order written."""
    return (row for kind, row in wandb_records(wandb_file) if kind == "history")


def segments(run_dir: Path) -> list[Path]:
    """The `.wandb` file of each segment of the run (one per start that reached wandb), oldest first."""
    return sorted(RunDir(run_dir).wandb.glob("*run-*/run-*.wandb"))


def held_logs(run_dir: Path) -> tuple[set[tuple[int, str]], set[str]]:
    """What the run's segments hold: (`trainer/global_step`, prefix) of each row with a KEPT_PREFIXES key, and the
    summary's keys."""
    rows, summary = set(), set()
    for path in segments(run_dir):
        for kind, record in wandb_records(path):
            if kind == "summary":
                summary.update(record)
            elif "trainer/global_step" in record:
                rows.update((record["trainer/global_step"], _kept(key)) for key in record if _kept(key))
    return rows, summary


def remove_empty_segments(run_dir: Path, say) -> None:
    """Remove the offline segments that hold no history row: starts killed before wandb wrote anything, which
    `wandb sync` would upload as empty runs."""
    empty = [path.parent for path in segments(run_dir)
             if path.parent.name.startswith("offline-") and next(history_rows(path), None) is None]  # fmt: skip
    for folder in empty:
        shutil.rmtree(folder, ignore_errors=True)
    if empty:
        say(f"wandb: removed {len(empty)} empty segment(s) of starts killed before their first row")


class KeptHistory:
    """The train/* and val/* rows a WandbLogger logged, by step (mixed into RunWandbLogger). After a resume each
    point is logged once: the rows a killed segment lost are logged again, those an earlier segment holds are not."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train_rows: dict[int, dict] = {}  # step -> the train/* and val/* values logged there
        self._held: set[tuple[int, str]] = set()  # after a resume, (step, prefix) the earlier segments hold
        self._held_summary: set[str] = set()  # and the keys of their summaries
        self._relog_due = False

    def keep_rows(self, step: int, metrics: dict) -> dict:
        """Before logging `metrics` at `step`: re-log the rows a killed segment lost, keep these values, and return
        `metrics` less the points an earlier segment holds (a step trained again after a kill -9)."""
        self.relog_lost()
        if any(key.startswith(KEPT_PREFIXES) for key in metrics):
            self.train_rows.setdefault(step, {}).update(
                {key: float(value) for key, value in metrics.items() if _kept(key) or key == "epoch"}
            )
        return {key: value for key, value in metrics.items() if (step, _kept(key)) not in self._held}

    def restore_train_rows(self, rows: list) -> None:
        """Take the rows a checkpoint carried, and read what the run's segment files hold."""
        self.train_rows = {int(step): dict(row) for step, row in rows}
        on_rank_zero = self._save_dir and rank_zero_only.rank == 0
        self._held, self._held_summary = held_logs(Path(self._save_dir)) if on_rank_zero else (set(), set())
        self._relog_due = True

    def lacks_val_row(self, step: int) -> bool:
        """Whether neither the checkpoint's rows nor a segment file holds a val/* value at `step`."""
        if any(key.startswith("val/") for key in self.train_rows.get(step, {})):
            return False
        return (step, "val/") not in self._held

    def holds_summary(self, key: str) -> bool:
        """Whether an earlier segment of the run put `key` in the wandb summary."""
        return key in self._held_summary

    def relog_lost(self) -> int:
        """Log the kept rows no segment holds, at their own steps, before anything newer (once after a resume);
        the number of steps logged again."""
        if not self._relog_due:
            return 0
        self._relog_due = False
        lost = 0
        for step, row in sorted(self.train_rows.items()):
            missing = {key for key in row if _kept(key) and (step, _kept(key)) not in self._held}
            if missing:
                lost += 1
                super().log_metrics(
                    {key: v for key, v in row.items() if key in missing or key == "epoch"}, step
                )
                self._held |= {(step, _kept(key)) for key in missing}
        if lost:
            rank_zero_info(
                f"wandb: re-logged the train/* and val/* rows of {lost} step(s) a killed run had not written"
            )
        return lost


def _kept(key: str) -> str | None:
    return next((prefix for prefix in KEPT_PREFIXES if key.startswith(prefix)), None)


def _row_not_logged_yet(trainer: L.Trainer, logger: KeptHistory) -> dict[int, dict]:
    """{step: row} of this step's train/* values when the save comes before Lightning logs them (ModelCheckpoint
    saves in on_train_batch_end), else {}: the resume starts after this step, so only the checkpoint has it."""
    step, every = trainer.global_step, trainer.log_every_n_steps
    # Only a logging step's values are its own: on other steps Lightning may still hold an earlier one.
    if step in logger.train_rows or not trainer.training or every <= 0 or step % every:
        return {}
    logged = metrics_to_log(trainer)
    row = {key: float(value) for key, value in logged.items() if key.startswith(TRAIN_PREFIX)}
    return {step: {**row, "epoch": float(trainer.current_epoch)}} if row else {}


class WandbResume(L.Callback):
    """Carry the wandb run id and the kept rows in every checkpoint; at the start of a resume, run the validation
    that the checkpoint was saved before, and Lightning skips, when no segment logged its values."""

    def __init__(self) -> None:
        self._resumed_step: int | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        for logger in loggers_of(trainer, WandbLogger):
            if logger.version:
                checkpoint[WANDB_ID_KEY] = str(logger.version)
        for logger in loggers_of(trainer, KeptHistory):
            rows = {**logger.train_rows, **_row_not_logged_yet(trainer, logger)}
            checkpoint[HISTORY_KEY] = [[step, row] for step, row in sorted(rows.items())]

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # Rows past the resumed step belong to the abandoned branch: this run logs them anew.
        step = self._resumed_step = checkpoint["global_step"]
        for logger in loggers_of(trainer, KeptHistory):
            logger.restore_train_rows([row for row in checkpoint.get(HISTORY_KEY, []) if row[0] <= step])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step, self._resumed_step = self._resumed_step, None
        if step is None or not _lacks_val_row(trainer, step):
            return

        # Lightning calls this only where the step was due a validation the save came before (not on SIGTERM's).
        def validate_instead() -> None:
            restore_due_validation(trainer)
            validate_again(trainer, step)

        replace_due_validation(trainer, validate_instead)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # The restart's check is over: Lightning did not ask, the step was not due.
        restore_due_validation(trainer)


def log_what_was_lost(trainer: L.Trainer, step: int) -> bool:
    """For a run resumed at its last step, which trains nothing: validate `step` when no segment holds its val/*
    values (the last step always validates), re-log the rows no segment holds; whether anything was logged."""
    validated = trainer.enable_validation and _lacks_val_row(trainer, step)
    if validated:
        validate_again(trainer, step)
    relogged = [logger.relog_lost() for logger in loggers_of(trainer, KeptHistory)]
    return validated or any(relogged)


def validate_again(trainer: L.Trainer, step: int) -> None:
    """Run the validation of `step`, which a stopped run had not logged, as the straight run did."""
    rank_zero_info(f"validating step {step} again: no wandb segment of this run holds its val/* values")
    validate_now(trainer)  # a fresh validation, as the straight run's


def _lacks_val_row(trainer: L.Trainer, step: int) -> bool:
    # Rank 0 reads the segment files; every rank must take the same decision (the validation syncs them).
    lacks = trainer.is_global_zero and any(
        logger.lacks_val_row(step) for logger in loggers_of(trainer, KeptHistory)
    )
    return bool(trainer.strategy.broadcast(lacks, src=0))
