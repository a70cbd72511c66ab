"""LightningCLI wiring: one directory per run, linked data/model keys, wandb logger, default callbacks, config.yaml."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
from pathlib import Path

import torch
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from checkpoints.resume import (
    check_resume_point,
    expand_run_dir_resume,
    read_resume_point,
    refuse_to_overwrite,
)
from checkpoints.run_dir import RunDir
from checkpoints.run_lock import RunDirBusyError, own_run_dir
from checkpoints.save_on_stop import GracefulCtrlC, LastCheckpoint
from checkpoints.settings import GPTCheckpoint, resume_last, with_checkpoint_io
from common.errors import UserError
from common.files import atomic_write, missing_folders, remove_if_empty
from common.library_internals import parse_without_links
from common.threads import apply_thread_count
from data.datamodule import check_numbers

from .attention_maps import AttentionMaps
from .callback_rules import loggers_of
from .checks import SUBCOMMANDS, refuse_unusable_run
from .console import LineProgress, StepProgressBar, order_help_sections, silence_known_noise
from .fit_summary import MAX_SCORED_TOKENS, FitReport, FitSummary
from .flops import ThroughputMonitor
from .init_from import Pretrained, apply_init_from
from .samples import SampleGenerations
from .wandb_history import WandbResume
from .wandb_logger import RunWandbLogger, is_run_logger, run_logger

TRAINER_DEFAULTS = {
    "trainer.max_steps": 5000,
    "trainer.max_epochs": -1,  # the train stream is endless; max_steps ends training
    "trainer.val_check_interval": 250,
    "trainer.check_val_every_n_epoch": None,
    "trainer.limit_val_batches": 50,
    "trainer.gradient_clip_val": 1.0,
    "trainer.log_every_n_steps": 10,
    "trainer.default_root_dir": "runs",
    "trainer.enable_model_summary": False,  # the run size report (FitReport) says more, and right
    "checkpoint.save_last": True,
    "checkpoint.every_n_train_steps": 500,
    "checkpoint.save_top_k": 0,
    "checkpoint.enable_version_counter": False,  # last.ckpt is re-linked in place, never last-v1.ckpt
}
REFUSED_FLAGS = {
    "--optimizer": "model.learning_rate, model.weight_decay, model.beta1 and model.beta2 set AdamW",
    "--lr_scheduler": "model.schedule, model.warmup_steps, model.min_lr_ratio and model.decay_fraction set the schedule",
}
# Sections logged to wandb: what shapes the run. (The logger's own settings and callbacks are not useful there.)
WANDB_SECTIONS = ("model", "data", "trainer", "checkpoint", "samples", "attention_maps", "seed_everything")


class GPTCLI(LightningCLI):
    """`python train.py fit --config configs/x.yaml`; `ctrl_c` receives the stop state that train.py prints."""

    def __init__(self, *args, ctrl_c: GracefulCtrlC | None = None, **kwargs) -> None:
        self.ctrl_c = ctrl_c or GracefulCtrlC()
        self.resumed_from_run_dir = False
        self.resumed: dict | None = None  # the checkpoint --ckpt_path names, read once (until the checks)
        self.explicit_config = None  # the keys the user set, for init_from
        self.pretrained: Pretrained | None = None
        silence_known_noise()
        tune_host_allocator()
        super().__init__(*args, auto_configure_optimizers=False, save_config_callback=RunConfig, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        offered = LightningCLI.subcommands()
        return {name: offered[name] for name in SUBCOMMANDS}

    def parse_arguments(self, parser, args) -> None:
        """Refuse LightningCLI's optimizer flags and expand `--ckpt_path <run dir>` before parsing."""
        order_help_sections(parser)
        if not (args is None or isinstance(args, list)):  # a dict or Namespace: Lightning parses it as is
            super().parse_arguments(parser, args)
            return
        args = list(sys.argv[1:] if args is None else args)
        for arg in args:  # they would silently replace LitGPT's AdamW and schedule
            flag = next((f for f in REFUSED_FLAGS if arg == f or arg.startswith((f + ".", f + "="))), None)
            if flag:
                raise UserError(
                    f"{flag} is not supported: {REFUSED_FLAGS[flag]} (see: python train.py fit --help)"
                )
        args, self.resumed_from_run_dir = expand_run_dir_resume(args)
        self.config = parser.parse_args(args)
        refuse_unusable_run(self.config)  # before Lightning seeds and says so
        # init_from refuses the model keys the user set: read those without the defaults.
        subcommand = self.config.get("subcommand")
        if self.config.get(f"{subcommand}.model.init_from" if subcommand else "model.init_from"):
            self.explicit_config = _explicit_keys(parser, args, subcommand)

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        # Read once for every check, and before Lightning's torch.load would turn a text file into a traceback.
        self.resumed = read_resume_point(ckpt_path)
        # As Lightning's: the checkpoint's hyperparameters over the parsed config, except from a run directory,
        # whose config.yaml already holds them (re-applying would undo the user's overrides).
        hparams = dict((self.resumed or {}).get("hyper_parameters", {}))
        hparams.pop("_instantiator", None)
        if hparams and not self.resumed_from_run_dir and Path(ckpt_path).is_file():
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def fit(self, model, datamodule=None, ckpt_path=None, **kwargs) -> None:
        """trainer.fit with Ctrl-C handled gracefully, as the run directory's one writer."""
        if ckpt_path:
            model.resuming()
        run_dir = Path(self.trainer.default_root_dir)
        made = missing_folders(run_dir)  # a new run's folder, and runs/ for a first run
        self.ctrl_c.install(self.trainer)
        for logger in loggers_of(self.trainer, RunWandbLogger):
            logger.follow(self.trainer)
        lock = None
        try:
            if self.trainer.is_global_zero:  # the writing process: one per run directory, checked here
                lock = own_run_dir(run_dir)
            self.trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)
        except RunDirBusyError:
            raise  # the folder is another live run's: nothing here to clean up
        except BaseException:
            # A run that fails before its first step leaves nothing worth keeping: a retry starts clean.
            if not self.ctrl_c.training_started:
                for logger in loggers_of(self.trainer, RunWandbLogger):
                    logger.discard_segment()
                if made:  # a new run
                    shutil.rmtree(run_dir, ignore_errors=True)
                    remove_if_empty(made)  # runs/ too, unless another run is starting in it
            raise
        finally:
            self.ctrl_c.restore()
            if lock is not None:
                lock.release()

    def add_arguments_to_parser(self, parser) -> None:
        for flag, kind, default, text in (
            ("--run_name", str | None, None, "Run directory name under trainer.default_root_dir; defaults to the "
             "config file's name."),
            ("--threads", int | None, None, "CPU threads for torch; null picks the free CPUs (CPUs minus load "
             "average, see docs/training.md)."),
            ("--wandb_project", str, "gqa-gpt", "wandb project the run logs to."),
            ("--score_tokens", int, MAX_SCORED_TOKENS, "Validation-text tokens scored in nats/char when fit ends "
             "(a forward each); 0 skips the score."),
        ):  # fmt: skip
            parser.add_argument(flag, type=kind, default=default, help=text)
        # One source of truth: the data module owns the vocabulary and context sizes, the model follows.
        parser.link_arguments("data.vocab_size", "model.vocab_size")
        parser.link_arguments("data.block_size", "model.block_size")
        parser.add_lightning_class_args(GPTCheckpoint, "checkpoint")
        parser.add_lightning_class_args(SampleGenerations, "samples")
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.set_defaults(TRAINER_DEFAULTS)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config  # None with run=False
        self.pretrained = apply_init_from(config, self.explicit_config)  # before anything is written
        if config.model.keep_quantized:
            tune_host_allocator(keep_blocks=True)
        check_numbers(config.data)  # before the model, whose vocab_size and block_size follow data's
        files = config.get("config") or []  # the run is named after the last config file by default
        name = config.run_name or (Path(str(files[-1])).stem if files else "default")
        run_dir = Path(config.trainer.default_root_dir) / name
        if self.subcommand in ("fit", None) and not config.get("ckpt_path"):
            refuse_to_overwrite(run_dir)
        if self.subcommand is not None:  # with run=False (benchmarks) the caller sets the threads itself
            rank_zero_info(apply_thread_count(config.get("threads"), torch.set_num_threads)[1])
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = str(RunDir(run_dir).checkpoints)
        # Held only for these checks: Lightning loads the checkpoint itself, and a kept dict would double its memory.
        resumed, self.resumed = self.resumed, None
        if self.subcommand == "fit" and config.get("ckpt_path") == "last":
            config.ckpt_path, resumed = resume_last(RunDir(run_dir).checkpoints)
        if resumed is not None:
            finished = check_resume_point(config, config.ckpt_path, resumed, self.subcommand or "fit")
            if finished:
                rank_zero_info(finished)
        ours = config.trainer.logger in (None, True) or is_run_logger(config.trainer.logger)
        if self.subcommand not in ("fit", None):
            # validate writes nothing into the run's folder (config.yaml, wandb) unless a logger is asked for.
            self.save_config_callback = None
            if ours:
                config.trainer.logger = False
        elif ours:
            # Rebuilt for this run directory, so a copied or moved run logs where it now is.
            config.trainer.logger = run_logger(run_dir, config.wandb_project, name, resumed)
        extra = [ThroughputMonitor(), LastCheckpoint(), self.ctrl_c, WandbResume(), FitReport()]
        # A ProgressBar callback while enable_progress_bar is False is an error in Lightning. Off a terminal,
        # plain lines: the rich bar would print nothing until the run ends.
        if config.trainer.enable_progress_bar is not False:
            extra.append(StepProgressBar() if sys.stdout.isatty() else LineProgress())
        # After the progress bar: its last line comes first.
        extra.append(FitSummary(config.get("score_tokens", MAX_SCORED_TOKENS)))
        config.trainer.plugins = with_checkpoint_io(
            config.trainer.plugins, config.checkpoint.keep_last, config.checkpoint.async_save
        )
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": extra}

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if self.pretrained is not None:  # the data module tokenizes with the model's tokenizer, trains none
            self.datamodule.use_tokenizer(self.pretrained.tokenizer)


class RunConfig(SaveConfigCallback):
    """config.yaml in the run folder and the wandb run, written once training starts, not in `setup`: a resume
    that then fails would already have rewritten it."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        pass

    def on_train_start(self, trainer, pl_module) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            atomic_write(
                RunDir(trainer.default_root_dir).config, self.parser.dump(self.config, skip_none=False)
            )
            self.save_config(trainer, pl_module, "fit")
        self.already_saved = True

    def save_config(self, trainer, pl_module, stage: str) -> None:
        config = self.config.as_dict()
        shown = {key: config[key] for key in WANDB_SECTIONS if key in config}
        if isinstance(shown.get("trainer"), dict):
            skipped = ("logger", "callbacks", "plugins")
            shown["trainer"] = {k: v for k, v in shown["trainer"].items() if k not in skipped}
        for logger in loggers_of(trainer, WandbLogger):
            # allow_val_change: a resume with --trainer.max_steps 7000 updates the value the run started with.
            logger.experiment.config.update(shown, allow_val_change=True)


def tune_host_allocator(keep_blocks: bool = False) -> bool:
    """Set glibc's malloc thresholds for training (True if applied). Most runs keep freed host memory in the
    process: glibc gave it back to the kernel, so each CPU step page-faulted the same activations in again. A run
    on kept blocks (QLoRA, `keep_blocks`) is there to fit in little memory: each allocation of 1 MB or more is
    mapped on its own and given back when freed (a 1B-class Q4_K_M file's QLoRA step needed ~1.7x the memory with
    freed memory kept: docs/finetune.md). Not off glibc, nor over the user's own malloc tuning."""
    tuned = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"} & set(os.environ)
    if tuned or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter numbers from glibc's malloc.h
    if keep_blocks:
        return bool(libc.mallopt(m_mmap_threshold, 2**20))
    return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20) and libc.mallopt(m_trim_threshold, 256 * 2**20))


def _explicit_keys(parser, args: list[str], subcommand: str | None):
    """The keys the config files and flags set for `subcommand`, without defaults (None: jsonargparse can't tell)."""
    explicit = parse_without_links(parser, args)
    return explicit.get(subcommand) if explicit is not None and subcommand else explicit
