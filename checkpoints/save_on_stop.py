"""Keep `last.ckpt` current at the moments ModelCheckpoint misses: SIGTERM, Ctrl-C and the end of training."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .run_dir import LAST_NAME


class LastCheckpoint(L.Callback):
    """Write `last.ckpt` next to the regular checkpoints when training ends or the job is told to stop.

    ModelCheckpoint saves every N steps, so a run ending between two saves (max_steps not a multiple of N,
    a time limit) would lose its last steps. On SIGTERM (a scheduler's preemption, `kill`), Lightning raises
    a SIGTERMException at the end of the current batch, so the state saved here is a clean step boundary;
    the exception then propagates and train.py exits non-zero. Other exceptions (a non-finite loss) save
    nothing: the last good checkpoint stays as it was.

    A signal that lands during a validation waits for the validation's end: Lightning would stop it halfway
    and save a checkpoint after which the resumed run never validates that step, so `val/loss` would miss a
    point. (A validation takes `trainer.limit_val_batches` batches: seconds, well inside a scheduler's grace.)
    """

    def __init__(self) -> None:
        self.saved_step: int | None = None
        self._deferred_stop = False

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        # Runs just before the evaluation loop checks the flag after each batch; on_validation_end puts it back.
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.received_sigterm:
            self._deferred_stop = True
            trainer._signal_connector.received_sigterm = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._deferred_stop:  # the training loop sees it right after this validation and stops there
            self._deferred_stop = False
            trainer._signal_connector.received_sigterm = True

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.saved_step = checkpoint["global_step"]

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_step != trainer.global_step:
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # SIGTERM, or the first Ctrl-C (training/ctrl_c.py); train.py prints the one line.
        if isinstance(exception, SIGTERMException):
            self._save(trainer)

    @staticmethod
    def _save(trainer: L.Trainer) -> None:
        if trainer.checkpoint_callback is not None:
            # Full state for resume; every rank calls it: sharded strategies save collectively.
            trainer.save_checkpoint(Path(trainer.checkpoint_callback.dirpath) / LAST_NAME, weights_only=False)
