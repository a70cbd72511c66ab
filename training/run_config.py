"""Save the run's config.yaml once training starts, and give wandb the full config, trainer settings included.

Lightning's SaveConfigCallback writes config.yaml in `setup`, before the checkpoint is restored: a resume
that then fails (weights of another size, a bad optimizer value) has already rewritten the run's config, and
the plain resume command fails the same way. Here the file is written at `on_train_start`, after every check
and the restore passed, atomically (a kill mid-write leaves the old file). Only `fit` installs this callback:
`validate`/`test`/`predict` write nothing into a run folder.
"""

from __future__ import annotations

from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

from checkpoints.run_dir import RunDir
from common.files import atomic_write

# Sections logged to wandb: what shapes the run. (The logger's own settings and callbacks are not useful there.)
WANDB_SECTIONS = ("model", "data", "trainer", "checkpoint", "samples", "attention_maps", "seed_everything")


class RunConfig(SaveConfigCallback):
    """config.yaml in the run folder at the start of training; the same config in the wandb run's config."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Nothing yet: see on_train_start."""

    def on_train_start(self, trainer, pl_module) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            text = self.parser.dump(self.config, skip_none=False)
            atomic_write(RunDir(trainer.default_root_dir).config, text)
            self.save_config(trainer, pl_module, "fit")
        self.already_saved = True

    def save_config(self, trainer, pl_module, stage: str) -> None:
        config = self.config.as_dict()
        shown = {key: _without_logger(key, config[key]) for key in WANDB_SECTIONS if key in config}
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # allow_val_change: a resume with --trainer.max_steps 7000 updates the value the run started with.
                logger.experiment.config.update(shown, allow_val_change=True)


def _without_logger(key: str, section):
    if key != "trainer" or not isinstance(section, dict):
        return section
    return {name: value for name, value in section.items() if name not in ("logger", "callbacks", "plugins")}
