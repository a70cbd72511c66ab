"""The project's WandbLogger: no deprecated `anonymous` setting, and the offline notice once the run exists."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .wandb_setup import record_wandb_run_id


class RunWandbLogger(WandbLogger):
    """A WandbLogger that says how to upload an offline run when, and only when, the run is created.

    Lightning creates the wandb run after the data is prepared, so a run that fails on its data prints no
    "upload later" line and leaves no run folder behind.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            # Lightning always passes anonymous=None, which wandb >= 0.2x warns about on every run.
            self._wandb_init.pop("anonymous", None)
        if "settings" not in self._wandb_init:
            import wandb

            # Offline, our one line says where the run is and how to upload it: wandb's banner and footer would
            # repeat it (the footer with a relative path, in ANSI colours even in a log file). Online, wandb keeps
            # the lines that give the run's URL.
            offline = bool(self._offline)
            self._wandb_init["settings"] = wandb.Settings(
                silent=offline, quiet=True, show_colors=sys.stderr.isatty()
            )
        self.segment: Path | None = None  # the offline run folder this process created, if any
        self._trainer = None
        self._finished = False
        self._sync_hint: str | None = None  # printed with the first metrics (see experiment)

    def follow(self, trainer) -> None:
        """Log every point at `trainer.global_step`: the 1-based count of finished optimizer steps that the
        console shows (`step 3500/3500`), for Lightning's own metrics as for the callbacks' images and tables.

        Lightning logs training and validation metrics at the 0-based index of the step (3499 for the last),
        so without this the train/loss of step 3500 would sit one step left of the samples logged after it.
        """
        self._trainer = trainer

    def log_metrics(self, metrics, step: int | None = None) -> None:
        if self._sync_hint:
            rank_zero_info(self._sync_hint)
            self._sync_hint = None
        if self._trainer is not None and self._trainer.state.fn == "fit":
            step = self._trainer.global_step
        super().log_metrics(metrics, step)

    def finalize(self, status: str) -> None:
        """Finish the wandb run here: wandb's own finish at exit ignores the settings above."""
        if status == "success" and self._sync_hint:  # a run too short to have logged metrics yet
            rank_zero_info(self._sync_hint)
            self._sync_hint = None
        super().finalize(status)
        if self._experiment is not None and not self._finished:
            self._finished = True
            self._experiment.finish(exit_code=0 if status == "success" else 1)

    def discard_segment(self) -> None:
        """Close and remove the offline segment this process created: for a resume that failed before its first
        step, so `wandb sync` does not upload an empty segment into the run."""
        if self.segment is None or self._experiment is None:
            return
        if not self._finished:
            self._finished = True
            self._experiment.finish()
        shutil.rmtree(self.segment, ignore_errors=True)
        self._experiment, self.segment = None, None

    @property
    def experiment(self):
        """The wandb run, created on first use; an offline run then prints its `wandb sync` command."""
        created = self._experiment is None
        if created and self._save_dir:
            Path(self._save_dir).mkdir(parents=True, exist_ok=True)  # wandb warns about a missing folder
        run = super().experiment
        if created and self._save_dir and getattr(run, "id", None):
            record_wandb_run_id(Path(self._save_dir), run.id)
        if created and self._offline and getattr(run, "dir", None):
            folder = Path(run.dir).parent
            self.segment = folder
            # Said with the first metrics: a run whose data setup fails after Lightning created the wandb run
            # (its setup hook does so first) has nothing to upload, and its segment is removed.
            self._sync_hint = f"wandb: no credentials (or WANDB_MODE=offline): logging offline. Upload later with: wandb sync {folder}"
        return run
