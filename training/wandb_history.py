"""train/* and val/* history that survives kill -9, which loses the last rows wandb had not written out: every
checkpoint carries the rows, and a resume re-logs those the run's `.wandb` files do not hold.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from checkpoints.run_dir import RunDir

from .lit_gpt import loggers_of

TRAIN_PREFIX = "train/"
KEPT_PREFIXES = (TRAIN_PREFIX, "val/")  # the scalar curves a resume gives back; media are not carried
# In the checkpoint: [[step, {key: value}], ...] of every row with a KEPT_PREFIXES key (the name predates val/*).
HISTORY_KEY = "train_history"
WANDB_ID_KEY = "wandb_run_id"  # in the checkpoint: so a resume without the run directory logs to the same run
_BLOCK, _HEADER = 32768, 7
_FULL, _LAST = 1, 4  # record types that end an assembled record


def history_rows(wandb_file: Path) -> Iterator[dict]:
    """The history rows of one `.wandb` file, {key: value}, in the order written: a LevelDB-style log of 32 KiB
    blocks of records with 7-byte headers, holding protobuf `Record`s."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = wandb_file.read_bytes()
    pos, payload = _HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # too little room for a header: the rest of the block is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        payload += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind not in (_FULL, _LAST) or pos > len(data):
            continue
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:  # a killed writer's torn last block: nothing after it was written whole
            return
        payload = b""
        if record.WhichOneof("record_type") == "history":
            yield {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }


def held_rows(run_dir: Path) -> set[tuple[int, str]]:
    """(`trainer/global_step`, prefix) for each row a segment of the run holds with a KEPT_PREFIXES key."""
    return {
        (row["trainer/global_step"], prefix)
        for path in sorted(RunDir(run_dir).wandb.glob("*run-*/run-*.wandb"))  # each segment's, oldest first
        for row in history_rows(path)
        if "trainer/global_step" in row
        for prefix in KEPT_PREFIXES
        if any(key.startswith(prefix) for key in row)
    }


class KeptHistory:
    """The train/* and val/* rows a WandbLogger logged, by step (mixed into RunWandbLogger)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train_rows: dict[int, dict] = {}  # step -> the train/* and val/* values logged there
        self._held: set[tuple[int, str]] | None = None  # after a resume, what the segment files hold (rank 0)

    def keep_rows(self, step: int, metrics: dict) -> None:
        """Before logging `metrics` at `step`: re-log the rows a killed segment lost, then keep these."""
        if self._held is not None:
            self._relog_lost()
        if any(key.startswith(KEPT_PREFIXES) for key in metrics):
            self.train_rows.setdefault(step, {}).update(
                {key: float(value) for key, value in metrics.items() if _kept(key) or key == "epoch"}
            )

    def restore_train_rows(self, rows: list) -> None:
        """Take the rows a checkpoint carried, and read which rows the run's segment files hold."""
        self.train_rows = {int(step): dict(row) for step, row in rows}
        on_rank_zero = self._save_dir and rank_zero_only.rank == 0
        self._held = held_rows(Path(self._save_dir)) if on_rank_zero else set()

    def lacks_val_row(self, step: int) -> bool:
        """Whether neither the checkpoint's rows nor a segment file holds a val/* value at `step`."""
        if any(key.startswith("val/") for key in self.train_rows.get(step, {})):
            return False
        return (step, "val/") not in (self._held or set())

    def _relog_lost(self) -> None:
        # Logged again at their own steps, before this segment logs anything newer.
        held, self._held = self._held, None
        lost = 0
        for step, row in sorted(self.train_rows.items()):
            missing = {key for key in row if _kept(key) and (step, _kept(key)) not in held}
            if missing:
                lost += 1
                super().log_metrics(
                    {key: v for key, v in row.items() if key in missing or key == "epoch"}, step
                )
        if lost:
            rank_zero_info(
                f"wandb: re-logged the train/* and val/* rows of {lost} step(s) a killed run had not written"
            )


def _kept(key: str) -> str | None:
    return next((prefix for prefix in KEPT_PREFIXES if key.startswith(prefix)), None)


def _row_not_logged_yet(trainer: L.Trainer, logger: KeptHistory) -> dict[int, dict]:
    """{step: row} of this step's train/* values when the save comes before Lightning logs them (ModelCheckpoint
    saves in on_train_batch_end), else {}: the resume starts after this step, so only the checkpoint has it."""
    step, every = trainer.global_step, trainer.log_every_n_steps
    # Only a logging step's values are its own: on other steps Lightning may still hold an earlier one.
    if step in logger.train_rows or not trainer.training or every <= 0 or step % every:
        return {}
    logged = trainer._logger_connector.metrics["log"]
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
        if step is None:
            return
        # Rank 0 reads the segment files; every rank must take the same decision (the validation syncs them).
        lacks = trainer.is_global_zero and any(
            logger.lacks_val_row(step) for logger in loggers_of(trainer, KeptHistory)
        )
        if not trainer.strategy.broadcast(lacks, src=0):
            return
        # Lightning calls this only where the step was due a validation the save came before (not on SIGTERM's).
        val_loop = trainer.fit_loop.epoch_loop.val_loop

        def validate_instead() -> None:
            _forget_patch(trainer)
            rank_zero_info(
                f"validating step {step} again: no wandb segment of this run holds its val/* values"
            )
            val_loop.restarting = False  # a fresh validation, as the straight run's
            trainer.validating = True
            first_loop_iter = trainer._logger_connector._first_loop_iter
            val_loop.run()
            trainer.training = True
            trainer._logger_connector._first_loop_iter = first_loop_iter

        val_loop.increment_progress_to_evaluation_end = validate_instead

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _forget_patch(trainer)  # the restart's check is over: Lightning did not ask, the step was not due


def _forget_patch(trainer: L.Trainer) -> None:
    vars(trainer.fit_loop.epoch_loop.val_loop).pop("increment_progress_to_evaluation_end", None)
