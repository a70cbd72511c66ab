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

from .run_dir import LAST_NAME


class LastCheckpoint(L.Callback):
    """Write `last.ckpt` next to the regular checkpoints when training ends or the job is told to stop.

    ModelCheckpoint saves every N steps, so a run ending between two saves (max_steps not a multiple of N,
    a time limit) would lose its last steps. On SIGTERM (a scheduler's preemption, `kill`), Lightning raises
    a SIGTERMException at the end of the current batch, so the state saved here is a clean step boundary;
    the exception then propagates and train.py exits non-zero. Other exceptions (a non-finite loss) save
    nothing: the last good checkpoint stays as it was.

    A signal that lands during a validation waits for the validation's end: Lightning would stop it halfway
    and save a checkpoint after which the resumed run never validates that step, so `val/loss` would miss a
    point. (A validation takes `trainer.limit_val_batches` batches: seconds, well inside a scheduler's grace.)
    """

    def __init__(self) -> None:
        self.saved_step: int | None = None
        self._deferred_stop = False

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        # Runs just before the evaluation loop checks the flag after each batch; on_validation_end puts it back.
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.received_sigterm:
            self._deferred_stop = True
            trainer._signal_connector.received_sigterm = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._deferred_stop:  # the training loop sees it right after this validation and stops there
            self._deferred_stop = False
            trainer._signal_connector.received_sigterm = True

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.saved_step = checkpoint["global_step"]

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_step != trainer.global_step:
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # SIGTERM, or the first Ctrl-C (GracefulCtrlC); train.py prints the one line.
        if isinstance(exception, SIGTERMException):
            self._save(trainer)

    @staticmethod
    def _save(trainer: L.Trainer) -> None:
        if trainer.checkpoint_callback is not None:
            # Full state for resume; every rank calls it: sharded strategies save collectively.
            trainer.save_checkpoint(Path(trainer.checkpoint_callback.dirpath) / LAST_NAME, weights_only=False)


class GracefulCtrlC(L.Callback):
    """Turns the first Ctrl-C of a training run into the SIGTERM path; a second Ctrl-C stops at once.

    Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread is, possibly halfway
    through an optimizer step, and Lightning then exits 1 without saving. Instead, while `install`ed, the
    first Ctrl-C only raises Lightning's SIGTERM flag: Lightning stops at the next step boundary (after the
    optimizer and schedule steps) and `LastCheckpoint` saves there, so the checkpoint resumes bit-identically.
    A Ctrl-C before training started, or a second one, exits 130 straight away (nothing worth saving yet, or
    the user does not want to wait).

    After the run stops, `stop_message()` is the one line train.py prints: where the checkpoint is and the
    exact command that resumes the run.
    """

    def __init__(self) -> None:
        self.pressed = False
        self.signal_name: str | None = None  # "Ctrl-C" or "SIGTERM" once the run stopped on a signal
        self.stopped_step: int | None = None
        self.checkpoint: Path | None = None
        self.run_dir: Path | None = None
        self._trainer: L.Trainer | None = None
        self.training_started = False  # True once the training loop has started (on_train_start)
        self._previous = None

    def install(self, trainer: L.Trainer) -> None:
        """Handle SIGINT for the duration of `trainer.fit` (signals can only be set from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            self._trainer = trainer
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        """Put back the SIGINT handler that was there before `install`."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.training_started = True

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        self.signal_name = "Ctrl-C" if self.pressed else "SIGTERM"
        self.stopped_step = trainer.global_step
        self.run_dir = Path(trainer.default_root_dir)
        callback = trainer.checkpoint_callback
        self.checkpoint = Path(callback.dirpath) / LAST_NAME if callback is not None else None

    def stop_message(self) -> str:
        """One line: the signal, the step the checkpoint holds, and the command that resumes the run."""
        if self.checkpoint is None:
            return f"stopped by {self.signal_name} at step {self.stopped_step}; checkpointing is off, nothing saved"
        return (
            f"stopped by {self.signal_name} at step {self.stopped_step}: saved {self.checkpoint}; "
            f"resume with: python train.py fit --ckpt_path {shlex.quote(str(self.run_dir))}"
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
        self._trainer._signal_connector.received_sigterm = True
        if self._trainer.is_global_zero:
            print(
                "Ctrl-C: saving last.ckpt after this step (Ctrl-C again stops at once)",
                file=sys.stderr,
                flush=True,
            )
