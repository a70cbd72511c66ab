"""Keep `last.ckpt` current at the moments ModelCheckpoint misses: SIGTERM, Ctrl-C and the end of training;
turn Ctrl-C into SIGTERM's clean stop and say how to resume."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from common.errors import EXIT_INTERRUPTED
from common.library_internals import set_stop_requested

from .run_dir import LAST_NAME


class LastCheckpoint(L.Callback):
    """Write `last.ckpt` when training ends or on SIGTERM (raised by Lightning at a clean step boundary); other
    exceptions save nothing. A signal during a validation waits for its end: stopped halfway, the resumed run
    would never validate that step."""

    def __init__(self) -> None:
        self.saved_step: int | None = None
        self._deferred_stop = False

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        # Runs just before the evaluation loop checks the flag after each batch; on_validation_end puts it back.
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.received_sigterm:
            self._deferred_stop = True
            set_stop_requested(trainer, False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._deferred_stop:  # the training loop sees it right after this validation and stops there
            self._deferred_stop = False
            set_stop_requested(trainer, True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.saved_step = checkpoint["global_step"]

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_step != trainer.global_step:
            self._save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # SIGTERM, or the first Ctrl-C (GracefulCtrlC); train.py prints the one line.
        if isinstance(exception, SIGTERMException):
            self._save(trainer)

    @staticmethod
    def _save(trainer: L.Trainer) -> None:
        if trainer.checkpoint_callback is not None:
            # Full state for resume; every rank calls it: sharded strategies save collectively.
            trainer.save_checkpoint(Path(trainer.checkpoint_callback.dirpath) / LAST_NAME, weights_only=False)


class GracefulCtrlC(L.Callback):
    """Turns the first Ctrl-C of a training run into the SIGTERM path (a KeyboardInterrupt could land mid optimizer
    step, and Lightning would exit 1 without saving); before training started, or a second time, it exits 130."""

    def __init__(self) -> None:
        self.pressed = False
        self.stopped = ""  # what train.py prints once the run stopped on a signal
        self._trainer: L.Trainer | None = None
        self.training_started = False
        self._previous = None

    def install(self, trainer: L.Trainer) -> None:
        """Handle SIGINT for the duration of `trainer.fit` (signals can only be set from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            self._trainer = trainer
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.training_started = True

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        self.stopped = f"stopped by {'Ctrl-C' if self.pressed else 'SIGTERM'} at step {trainer.global_step}"
        if trainer.checkpoint_callback is None:
            self.stopped += "; checkpointing is off, nothing saved"
        else:
            saved, run = Path(trainer.checkpoint_callback.dirpath) / LAST_NAME, Path(trainer.default_root_dir)
            self.stopped += (
                f": saved {saved}; resume with: python train.py fit --ckpt_path {shlex.quote(str(run))}"
            )

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.pressed or not self.training_started or self._trainer is None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # a third Ctrl-C gets Python's default
            when = "again: stopped at once" if self.pressed else "before training started: nothing to save"
            print(f"interrupted (Ctrl-C) {when}", file=sys.stderr, flush=True)
            # SystemExit, not KeyboardInterrupt: Lightning turns the latter into exit code 1.
            raise SystemExit(EXIT_INTERRUPTED)
        self.pressed = True
        # Lightning's own flag: checked once per step, after the optimizer and scheduler steps.
        set_stop_requested(self._trainer, True)
        if self._trainer.is_global_zero:
            print(
                "Ctrl-C: saving last.ckpt after this step (Ctrl-C again stops at once)",
                file=sys.stderr,
                flush=True,
            )
