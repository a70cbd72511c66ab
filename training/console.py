"""What train.py shows on the terminal: `fit --help` in a useful order, no known noise, and progress in optimizer
steps out of trainer.max_steps (the train stream is one endless epoch: Lightning's bar shows `Epoch 0/-2`).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from common.threads import busy_note

# Section titles of `fit --help`, in the order shown; the others (the ~440 lines of Trainer flags last) follow.
SECTION_TITLES = {
    "model": "model: the GPT's shape and its optimizer (AdamW, warmup + schedule)",
    "data": "data: corpus, tokenizer, context length and batch size",
    "checkpoint": "checkpoint: where and how often checkpoints are saved (ModelCheckpoint)",
    "samples": "samples: text generated during training and logged as a table",
    "attention_maps": "attention_maps: attention images and per-head scores logged during training",
    "trainer": "trainer: Lightning Trainer flags (steps, devices, precision, validation, ...)",
}
# Printed on every run by the installed Lightning, with nothing for the user to do; the device lines repeat
# trainer.accelerator, and the run size report follows them.
NOISE_LOG_PREFIXES = ("💡 Tip: For seamless cloud", "GPU available:", "TPU available:", "HPU available:")
LINES_PER_RUN = 100  # the plain-line progress prints at most about this many lines


def order_help_sections(parser) -> None:
    """In the parser of every subcommand: readable section titles, the project's sections and --ckpt_path
    before the Trainer's flags, and a usage line (argparse's would list all ~400 flags before anything else)."""
    subcommands = getattr(parser, "_subcommands_action", None)
    for subparser in subcommands.choices.values() if subcommands else [parser]:
        subparser.usage = (
            "%(prog)s [--config CONFIG] [--KEY VALUE ...]   (keys below; --print_config shows the result)"
        )
        groups = subparser.groups or {}
        for key, title in SECTION_TITLES.items():
            if key in groups:
                groups[key].title, groups[key].description = title, None
        first = [groups[key] for key in SECTION_TITLES if key in groups and key != "trainer"]
        for group in subparser._action_groups:
            action = next((action for action in group._group_actions if action.dest == "ckpt_path"), None)
            if action is not None:
                group.title, group.description = "resume: where fit continues from", None
                action.help = (
                    "runs/<run> resumes that run with its saved config.yaml (other flags apply on top); "
                    "'last' (with the run's --config or --run_name) its newest checkpoint; or a .ckpt file."
                )
                first.insert(0, group)
                break
        last = [groups["trainer"]] if "trainer" in groups else []
        rest = [group for group in subparser._action_groups if group not in first and group not in last]
        # argparse prints groups in list order; keep its first two (positionals, options) on top.
        subparser._action_groups[:] = rest[:2] + first + rest[2:] + last


def _not_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(NOISE_LOG_PREFIXES)


def silence_known_noise() -> None:
    """Drop the litlogger tip, Lightning's device lines and torch's LeafSpec deprecation (raised inside
    Lightning); in a log file, also the datasets library's progress bars, whose carriage returns pile up."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_not_noise)  # added once however often this runs
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    if not sys.stderr.isatty():
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()


class StepProgressBar(RichProgressBar):
    """Lightning's rich bar, counting optimizer steps out of trainer.max_steps."""

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self.trainer.max_steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'step':{len(self.validation_description)}}"

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's run id: no use while training
        return metrics

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._update(self.train_progress_bar_id, trainer.global_step)


class LineProgress(ProgressBar):
    """One line every few optimizer steps (and at the last), for output that is not a terminal."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled, self._start_time, self._start_step = True, 0.0, 0

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_time, self._start_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, total = trainer.global_step, trainer.max_steps
        every = max(trainer.log_every_n_steps, total // LINES_PER_RUN, 1)  # stretched for a long run
        # The last step's line waits for on_train_end, after the step's validation: it shows the new val/loss.
        if self._enabled and step % every == 0 and step != total:
            self._print_line(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._enabled:
            self._print_line(trainer, pl_module)

    def _print_line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step, total = trainer.global_step, trainer.max_steps
        elapsed = time.monotonic() - self._start_time
        done = step - self._start_step
        line = f"step {step}/{total}" if total > 0 else f"step {step}"
        if total > 0 and done > 0:
            line += f" | {_clock(elapsed)} elapsed, ~{_clock(elapsed / done * (total - step))} left"
        metrics = " ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in self.get_metrics(trainer, pl_module).items()
            if key != "v_num"  # the logger's run id
        )
        busy = busy_note(torch.get_num_threads())
        print(" | ".join(part for part in (line, metrics, busy) if part), flush=True)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
