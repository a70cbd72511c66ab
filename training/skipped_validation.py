"""At the start of a resume, run the validation that Lightning skips there when no segment logged its values.

ModelCheckpoint saves in on_train_batch_end, before that step's validation; a resume from that checkpoint does
not validate again (Lightning counts the validation as done), so when the run was killed before wandb wrote the
val/* row, no segment would ever hold it. Run then, the validation gives the straight run's values: the same
weights and the same validation batches.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .wandb_logger import run_loggers


class ValidateSkippedStep(L.Callback):
    """Turn Lightning's skip of the resumed step's validation into a run of it when its val/* row is missing."""

    def __init__(self) -> None:
        self._resumed_step: int | None = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._resumed_step = checkpoint["global_step"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step, self._resumed_step = self._resumed_step, None
        if step is None:
            return
        # Rank 0 reads the segment files; every rank must take the same decision (the validation syncs them).
        lacks = trainer.is_global_zero and any(logger.lacks_val_row(step) for logger in run_loggers(trainer))
        if not trainer.strategy.broadcast(lacks, src=0):
            return
        # Lightning's own rule says whether the step was due a validation: on such a restart it fast-forwards
        # the validation loop's counters (not on a save made after the validation, e.g. on SIGTERM).
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
