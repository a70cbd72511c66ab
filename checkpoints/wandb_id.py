"""The wandb run id a checkpoint carries, so a resume logs to the same wandb run even without the run directory."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from .format import read_checkpoint

WANDB_ID_KEY = "wandb_run_id"


class WandbIdInCheckpoint(L.Callback):
    """Store the wandb run id in every checkpoint."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and logger.version:
                checkpoint[WANDB_ID_KEY] = str(logger.version)


def stored_wandb_id(ckpt_path: str | None) -> str | None:
    """The wandb run id saved in the checkpoint at `ckpt_path` (None without one)."""
    if not ckpt_path or not Path(ckpt_path).exists():  # a file, or a sharded checkpoint folder
        return None
    return read_checkpoint(ckpt_path)[0].get(WANDB_ID_KEY)
