"""Save a resumable checkpoint when the job is told to stop (SIGTERM from a scheduler or `kill`)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info


class SigtermCheckpoint(L.Callback):
    """On SIGTERM, write `last.ckpt` next to the regular checkpoints so `--ckpt_path last` resumes there.

    Lightning turns the signal into a SIGTERMException at the end of the current batch, so the state saved
    here is a clean step boundary; the exception then propagates and train.py exits non-zero.
    """

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.checkpoint_callback is None:
            return
        path = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        trainer.save_checkpoint(path)  # every rank calls it: sharded strategies save collectively
        rank_zero_info(f"SIGTERM: saved {path} at step {trainer.global_step}; resume with --ckpt_path last")
