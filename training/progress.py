"""Training progress in optimizer steps out of trainer.max_steps: a rich bar on a terminal, plain lines elsewhere.

The train stream is one endless epoch (max_epochs -1) read until max_steps, so Lightning's own bar shows
`Epoch 0/-2` and a batch count out of the stream's nominal length; and with output redirected (a log file,
a batch job) the rich bar prints nothing until the run ends.
"""

from __future__ import annotations

import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from common.threads import busy_note

LINES_PER_RUN = 100  # the plain-line progress prints at most about this many lines


def progress_for_output() -> ProgressBar:
    """A rich bar when stdout is a terminal, otherwise one plain line every few steps."""
    return StepProgressBar() if sys.stdout.isatty() else LineProgress()


def _metrics_text(metrics: dict) -> str:
    shown = {key: value for key, value in metrics.items() if key != "v_num"}
    return " ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                    for key, value in shown.items())  # fmt: skip


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
        self._enabled = True
        self._start_time = 0.0
        self._start_step = 0

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def interval(self, trainer: L.Trainer) -> int:
        """Steps between two lines: trainer.log_every_n_steps, stretched so a run prints ~LINES_PER_RUN."""
        return max(trainer.log_every_n_steps, trainer.max_steps // LINES_PER_RUN, 1)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_time, self._start_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, total = trainer.global_step, trainer.max_steps
        # The last step's line waits for on_train_end: a validation after that step would come after it, and
        # the line would show the previous val/loss.
        if self._enabled and step % self.interval(trainer) == 0 and step != total:
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
        metrics = _metrics_text(self.get_metrics(trainer, pl_module))
        busy = busy_note(torch.get_num_threads())
        print(" | ".join(part for part in (line, metrics, busy) if part), flush=True)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
