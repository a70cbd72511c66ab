"""What `train.py` shows a user: help sections in a useful order, refused flags, no known noise."""

from __future__ import annotations

import logging
import sys
import warnings

from common.errors import UserError

# Section titles of `fit --help`, in the order shown; any other section (the ~440 lines of Trainer flags
# last) keeps its place after these.
SECTION_TITLES = {
    "model": "model: the GPT's shape and its optimizer (AdamW, warmup + schedule)",
    "data": "data: corpus, tokenizer, context length and batch size",
    "checkpoint": "checkpoint: where and how often checkpoints are saved (ModelCheckpoint)",
    "samples": "samples: text generated during training and logged as a table",
    "attention_maps": "attention_maps: attention images and per-head scores logged during training",
    "trainer": "trainer: Lightning Trainer flags (steps, devices, precision, validation, ...)",
}
FIRST, LAST = ("model", "data", "checkpoint", "samples", "attention_maps"), ("trainer",)

REFUSED_FLAGS = {
    "--optimizer": "model.learning_rate, model.weight_decay, model.beta1 and model.beta2 set AdamW",
    "--lr_scheduler": "model.schedule, model.warmup_steps, model.min_lr_ratio and model.decay_fraction set the schedule",
}

# Printed on every run by the installed versions of Lightning and torch, with nothing for the user to do.
NOISE_LOG_PREFIXES = (
    "💡 Tip: For seamless cloud",
    # Device lines: the accelerator in use is in trainer.accelerator, and the run size report follows.
    "GPU available:",
    "TPU available:",
    "HPU available:",
)
NOISE_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")
NOISE_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def order_help_sections(parser) -> None:
    """Give the project's sections readable titles and show them before the Trainer's flags, in the parser
    of every subcommand (fit, validate, ...)."""
    subcommands = getattr(parser, "_subcommands_action", None)
    for subparser in subcommands.choices.values() if subcommands else [parser]:
        _order_sections(subparser)


def _order_sections(parser) -> None:
    # argparse's usage would list all ~400 flags before anything else.
    parser.usage = (
        "%(prog)s [--config CONFIG] [--KEY VALUE ...]   (keys below; --print_config shows the result)"
    )
    groups = parser.groups or {}
    for key, title in SECTION_TITLES.items():
        if key in groups:
            groups[key].title = title
            groups[key].description = None
    first = [groups[key] for key in FIRST if key in groups]
    resume = _describe_ckpt_path(parser)
    if resume is not None:
        first.insert(0, resume)
    last = [groups[key] for key in LAST if key in groups]
    rest = [group for group in parser._action_groups if group not in first and group not in last]
    # argparse prints groups in list order; keep its first two (positionals, options) on top.
    parser._action_groups[:] = rest[:2] + first + rest[2:] + last


def _describe_ckpt_path(parser):
    """The section holding --ckpt_path, retitled, with the run-directory form first in its help."""
    for group in parser._action_groups:
        action = next((action for action in group._group_actions if action.dest == "ckpt_path"), None)
        if action is not None:
            group.title, group.description = "resume: where fit continues from", None
            action.help = (
                "runs/<run> resumes that run with its saved config.yaml (other flags apply on top); "
                "'last' (with the run's --config or --run_name) its newest checkpoint; or a .ckpt file."
            )
            return group
    return None


def refuse_optimizer_flags(args: list[str]) -> None:
    """LightningCLI's --optimizer/--lr_scheduler would silently replace LitGPT's AdamW and schedule."""
    for arg in args:
        flag = next(
            (flag for flag in REFUSED_FLAGS if arg == flag or arg.startswith((flag + ".", flag + "="))), None
        )
        if flag:
            raise UserError(
                f"{flag} is not supported: {REFUSED_FLAGS[flag]} (see: python train.py fit --help)"
            )


class _DropPrefixes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOISE_LOG_PREFIXES)


def silence_known_noise() -> None:
    """Drop the litlogger tip, Lightning's device lines and torch's LeafSpec deprecation (raised inside
    Lightning); in a log file (stderr not a terminal), also the datasets library's progress bars, whose carriage
    returns pile up into one unreadable line."""
    for name in NOISE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
            logger.addFilter(_DropPrefixes())
    warnings.filterwarnings("ignore", message=NOISE_WARNING, category=FutureWarning)
    if not sys.stderr.isatty():
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
