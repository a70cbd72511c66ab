"""LightningCLI wiring: one directory per run, linked data/model keys, wandb logger, default callbacks."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .attention_maps import AttentionMaps
from .fit_report import FitReport
from .last_checkpoint import LastCheckpoint
from .samples import SampleGenerations
from .throughput import ThroughputMonitor
from .wandb_setup import wandb_offline

TRAINER_DEFAULTS = {
    "trainer.max_steps": 5000,
    "trainer.max_epochs": -1,  # the train stream is endless; max_steps ends training
    "trainer.val_check_interval": 250,
    "trainer.check_val_every_n_epoch": None,
    "trainer.limit_val_batches": 50,
    "trainer.gradient_clip_val": 1.0,
    "trainer.log_every_n_steps": 10,
    "trainer.default_root_dir": "runs",
    "checkpoint.save_last": True,
    "checkpoint.every_n_train_steps": 500,
    "checkpoint.save_top_k": 0,
}


class UserError(ValueError):
    """A mistake in the command line or config; train.py prints it as one line."""


class GPTCLI(LightningCLI):
    """`python train.py fit --config configs/x.yaml`: see README for the keys."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_name", type=str | None, default=None, help="Run directory name under trainer.default_root_dir; defaults to the config file's name.")
        parser.add_argument("--wandb_project", type=str, default="gqa-gpt", help="wandb project the run logs to.")
        # One source of truth: the data module owns the vocabulary and context sizes, the model follows.
        parser.link_arguments("data.vocab_size", "model.vocab_size")
        parser.link_arguments("data.block_size", "model.block_size")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(SampleGenerations, "samples")
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.set_defaults(TRAINER_DEFAULTS)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config  # None with run=False
        run_dir = Path(config.trainer.default_root_dir) / (config.run_name or _config_stem(config))
        if self.subcommand in ("fit", None) and not config.get("ckpt_path"):
            _refuse_to_overwrite(run_dir)
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = str(run_dir / "checkpoints")
        if config.trainer.logger in (None, True):
            config.trainer.logger = _wandb_logger(run_dir, config.wandb_project, config.run_name or run_dir.name)
        extra = [ThroughputMonitor(), LastCheckpoint(), FitReport()]
        if config.trainer.logger is not False:  # LearningRateMonitor refuses to run without a logger
            extra.append(LearningRateMonitor(logging_interval="step"))
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": extra}


def _config_stem(config) -> str:
    files = config.get("config") or []
    return Path(str(files[-1])).stem if files else "default"


def _refuse_to_overwrite(run_dir: Path) -> None:
    if any((run_dir / "checkpoints").glob("*.ckpt")):
        raise UserError(
            f"{run_dir} already holds checkpoints; resume with --ckpt_path last or start a new run with --run_name"
        )


def _wandb_logger(run_dir: Path, project: str, name: str) -> dict:
    offline = wandb_offline()
    run_dir.mkdir(parents=True, exist_ok=True)
    if offline:
        rank_zero_info(
            f"wandb: no credentials (or WANDB_MODE=offline): logging offline under {run_dir}/wandb. "
            f"Upload later with: wandb sync {run_dir}/wandb/offline-run-*"
        )
    return {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"save_dir": str(run_dir), "project": project, "name": name, "offline": offline},
    }
