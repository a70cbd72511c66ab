"""LightningCLI wiring: one directory per run, linked data/model keys, wandb logger, default callbacks."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from checkpoints.checks import check_readable, refuse_size_change
from checkpoints.choice import checkpoint_step
from checkpoints.resume import expand_run_dir_resume
from checkpoints.run_dir import LAST_NAME, RunDir
from checkpoints.run_lock import RunDirBusyError, own_run_dir
from checkpoints.save_on_stop import LastCheckpoint
from checkpoints.settings import GPTCheckpoint, resolve_ckpt_path, with_checkpoint_io
from checkpoints.wandb_id import WandbIdInCheckpoint, stored_wandb_id
from common.errors import UserError
from common.files import refuse_unwritable_folder
from data.datamodule import check_numbers

from .attention_maps import AttentionMaps
from .cli_help import order_help_sections, refuse_optimizer_flags, silence_known_noise
from .ctrl_c import GracefulCtrlC
from .fit_report import FitReport
from .fit_summary import MAX_SCORED_TOKENS, FitSummary
from .host_allocator import retain_freed_memory
from .init_from import Pretrained, apply_init_from
from .progress import progress_for_output
from .run_config import RunConfig
from .samples import SampleGenerations
from .skipped_validation import ValidateSkippedStep
from .throughput import ThroughputMonitor
from .wandb_logger import TrainHistoryInCheckpoint, run_loggers
from .wandb_setup import wandb_offline, wandb_run_id

TRAINER_DEFAULTS = {
    "trainer.max_steps": 5000,
    "trainer.max_epochs": -1,  # the train stream is endless; max_steps ends training
    "trainer.val_check_interval": 250,
    "trainer.check_val_every_n_epoch": None,
    "trainer.limit_val_batches": 50,
    "trainer.gradient_clip_val": 1.0,
    "trainer.log_every_n_steps": 10,
    "trainer.default_root_dir": "runs",
    "trainer.enable_model_summary": False,  # the run size report (training/fit_report.py) says more, and right
    "checkpoint.save_last": True,
    "checkpoint.every_n_train_steps": 500,
    "checkpoint.save_top_k": 0,
    "checkpoint.enable_version_counter": False,  # last.ckpt is re-linked in place, never last-v1.ckpt
}


class RunAlreadyFinished(Exception):
    """Resuming a run whose checkpoint already reached trainer.max_steps: nothing to train (exit 0)."""


class GPTCLI(LightningCLI):
    """`python train.py fit --config configs/x.yaml`: see README for the keys.

    `ctrl_c` receives the stop state of a run interrupted by Ctrl-C or SIGTERM (train.py prints it).
    LightningCLI's own --optimizer/--lr_scheduler flags are off: LitGPT owns AdamW and its schedule.
    """

    def __init__(self, *args, ctrl_c: GracefulCtrlC | None = None, **kwargs) -> None:
        self.ctrl_c = ctrl_c or GracefulCtrlC()
        self.resumed_from_run_dir = False
        self.explicit_config = None
        self.pretrained: Pretrained | None = None
        silence_known_noise()
        retain_freed_memory()
        super().__init__(*args, auto_configure_optimizers=False, save_config_callback=RunConfig, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit and validate only: test and predict need test/predict loops that LitGPT does not define."""
        offered = LightningCLI.subcommands()
        return {name: offered[name] for name in ("fit", "validate")}

    def parse_arguments(self, parser, args) -> None:
        """Refuse LightningCLI's optimizer flags and expand `--ckpt_path <run dir>` before parsing."""
        order_help_sections(parser)
        if not (args is None or isinstance(args, list)):  # a dict or Namespace: Lightning parses it as is
            super().parse_arguments(parser, args)
            return
        args = list(sys.argv[1:] if args is None else args)
        refuse_optimizer_flags(args)
        args, self.resumed_from_run_dir = expand_run_dir_resume(args)
        self.config = parser.parse_args(args)
        _refuse_unusable_run(self.config)  # before Lightning seeds and says so
        if _init_from(self.config):  # init_from refuses keys the user set against the model: those set
            self.explicit_config = _explicit_keys(parser, args)

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        # Before Lightning's own torch.load of the file, which turns a text file into a traceback.
        check_readable(self.config[subcommand].get("ckpt_path") if subcommand else None)
        # Lightning re-applies a checkpoint's hyperparameters over the parsed config; from a run directory the
        # saved config.yaml already holds them, and re-applying would undo the user's explicit overrides.
        if not self.resumed_from_run_dir:
            super()._parse_ckpt_path()

    def fit(self, model, datamodule=None, ckpt_path=None, **kwargs) -> None:
        """trainer.fit with Ctrl-C handled gracefully, after checking the resumed run is not already done."""
        _refuse_finished_run(self.trainer, ckpt_path)
        if ckpt_path:  # a resume restores our checkpoint, never the init_from weights
            model.pretrained_pending = False
        run_dir = Path(self.trainer.default_root_dir)
        new_run = not run_dir.exists()
        self.ctrl_c.install(self.trainer)
        for logger in run_loggers(self.trainer):
            logger.follow(self.trainer)
        lock = None
        try:
            if self.trainer.is_global_zero:  # the writing process: one per run directory, checked here
                lock = own_run_dir(run_dir)
            self.trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)
        except RunDirBusyError:
            raise  # the folder is another live run's: nothing here to clean up
        except BaseException:
            # A run that fails before its first step (data setup, a config check in setup) leaves only a
            # config.yaml and an empty wandb run: remove the folder this command created, so a retry starts clean.
            if not self.ctrl_c.training_started:
                for logger in run_loggers(self.trainer):
                    logger.discard_segment()
                if new_run:
                    shutil.rmtree(run_dir, ignore_errors=True)
            raise
        finally:
            self.ctrl_c.restore()
            if lock is not None:
                lock.release()

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Run directory name under trainer.default_root_dir; defaults to the config file's name.",
        )
        parser.add_argument(
            "--threads",
            type=int | None,
            default=None,
            help="CPU threads for torch; null picks the free CPUs (CPUs minus load average, see docs/training.md).",
        )
        parser.add_argument(
            "--wandb_project", type=str, default="gqa-gpt", help="wandb project the run logs to."
        )
        parser.add_argument(
            "--score_tokens",
            type=int,
            default=MAX_SCORED_TOKENS,
            help="Validation-text tokens scored in nats/char when fit ends (a forward each); 0 skips the score.",
        )
        # One source of truth: the data module owns the vocabulary and context sizes, the model follows.
        parser.link_arguments("data.vocab_size", "model.vocab_size")
        parser.link_arguments("data.block_size", "model.block_size")
        parser.add_lightning_class_args(GPTCheckpoint, "checkpoint")
        parser.add_lightning_class_args(SampleGenerations, "samples")
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.set_defaults(TRAINER_DEFAULTS)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config  # None with run=False
        explicit = self.explicit_config
        if explicit is not None and self.subcommand:
            explicit = explicit.get(self.subcommand)
        self.pretrained = apply_init_from(config, explicit)  # before anything is written
        check_numbers(config.data)  # before the model, whose vocab_size and block_size follow data's
        run_dir = Path(config.trainer.default_root_dir) / (config.run_name or _config_stem(config))
        if self.subcommand in ("fit", None) and not config.get("ckpt_path"):
            _refuse_to_overwrite(run_dir)
        check_readable(config.get("ckpt_path"))  # with run=False, _parse_ckpt_path did not run
        if self.subcommand is not None:  # with run=False (benchmarks) the caller sets the threads itself
            _apply_threads(config.get("threads"))
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = str(RunDir(run_dir).checkpoints)
        if self.subcommand == "fit":
            config.ckpt_path = resolve_ckpt_path(RunDir(run_dir).checkpoints, config.get("ckpt_path"))
        refuse_size_change(config, config.get("ckpt_path"), self.subcommand or "fit")
        if self.subcommand not in ("fit", None):
            # validate prints its results; it writes nothing into the training run's folder
            # (no config.yaml, no wandb segment under the run's id) unless a logger is asked for explicitly.
            self.save_config_callback = None
            if config.trainer.logger in (None, True) or _is_run_logger(config.trainer.logger):
                config.trainer.logger = False
        # A resumed run's saved config names the wandb logger of the folder it was saved in: rebuild it for
        # this run directory, so a copied or moved run logs where it now is.
        if config.trainer.logger in (None, True) or _is_run_logger(config.trainer.logger):
            run_id = wandb_run_id(run_dir, stored_wandb_id(config.get("ckpt_path")))
            config.trainer.logger = _wandb_logger(
                run_dir, config.wandb_project, config.run_name or run_dir.name, run_id
            )
        extra = [ThroughputMonitor(), LastCheckpoint(), self.ctrl_c, WandbIdInCheckpoint()]
        extra += [TrainHistoryInCheckpoint(), ValidateSkippedStep(), FitReport()]
        # A ProgressBar callback while enable_progress_bar is False is an error in Lightning.
        if config.trainer.enable_progress_bar is not False:
            extra.append(progress_for_output())
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


def _init_from(config) -> bool:
    prefix = f"{config.get('subcommand')}." if config.get("subcommand") else ""
    return bool(config.get(f"{prefix}model.init_from"))


def _explicit_keys(parser, args: list[str]):
    """The keys the config files and flags set, without defaults (None if jsonargparse cannot tell)."""
    try:  # without the links, which fail on a missing default (data.vocab_size -> model.vocab_size)
        from jsonargparse._link_arguments import skip_apply_links
    except ImportError:
        return None
    with skip_apply_links():
        return parser.parse_args(args, defaults=False)


def _apply_threads(requested: int | None) -> None:
    import torch
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from common.threads import apply_thread_count

    _, line = apply_thread_count(requested, torch.set_num_threads)
    rank_zero_info(line)


def _config_stem(config) -> str:
    files = config.get("config") or []
    return Path(str(files[-1])).stem if files else "default"


def _refuse_unusable_run(parsed) -> None:
    """One line, before anything is read or written, for a run that could not be found or written."""
    subcommand = parsed.get("subcommand")
    config = parsed[subcommand] if subcommand else parsed
    if config.get("ckpt_path") == "last" and not config.get("config") and not config.get("run_name"):
        # Without them `last` would mean runs/default, a new run with the default settings.
        raise UserError(
            "--ckpt_path last resumes the run that --config or --run_name names, and neither was given; "
            "resume a run from its folder with --ckpt_path runs/<run>"
        )
    cache = Path(config.data.cache_dir).expanduser()
    if not cache.is_dir():  # one already there may be a read-only prepared cache
        refuse_unwritable_folder(cache, "--data.cache_dir")
    if subcommand in ("fit", None):
        refuse_unwritable_folder(Path(config.trainer.default_root_dir), "--trainer.default_root_dir")


def _refuse_to_overwrite(run_dir: Path) -> None:
    if any(RunDir(run_dir).checkpoints.glob("*.ckpt")):
        raise UserError(
            f"{run_dir} already holds checkpoints; resume it with `python train.py fit --ckpt_path {run_dir}` "
            "or start a new run with --run_name"
        )


def _refuse_finished_run(trainer, ckpt_path: str | None) -> None:
    if not ckpt_path or trainer.max_steps < 0:
        return
    if ckpt_path == "last" and trainer.checkpoint_callback is not None:
        ckpt_path = str(Path(trainer.checkpoint_callback.dirpath) / LAST_NAME)
    step = checkpoint_step(Path(ckpt_path)) if Path(ckpt_path).exists() else None
    if step is not None and step >= trainer.max_steps:
        raise RunAlreadyFinished(
            f"{ckpt_path} is at step {step}, already trainer.max_steps={trainer.max_steps}: nothing to train "
            "(raise --trainer.max_steps to train further)"
        )


RUN_LOGGER = "training.wandb_logger.RunWandbLogger"


def _is_run_logger(logger) -> bool:
    """True for the wandb logger this CLI adds to every run (as a resumed run's config.yaml records it)."""
    get = getattr(logger, "get", None)
    return callable(get) and get("class_path") == RUN_LOGGER


def _wandb_logger(run_dir: Path, project: str, name: str, run_id: str) -> dict:
    # No mkdir and no message here: both wait until the wandb run is created (see RunWandbLogger).
    where = {"save_dir": str(run_dir), "project": project, "name": name, "offline": wandb_offline()}
    # One wandb run across preemptions and resumes.
    return {"class_path": RUN_LOGGER, "init_args": {**where, "id": run_id, "resume": "allow"}}
