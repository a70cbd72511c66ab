"""The project's wandb logging: online or offline without ever prompting for a login, one wandb run per run
directory (its id kept in the run directory and in every checkpoint), history that survives kill -9."""

from __future__ import annotations

import netrc
import os
import secrets
import shutil
import string
import sys
from pathlib import Path
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from checkpoints.run_dir import RunDir
from common.files import atomic_write

from .wandb_history import WANDB_ID_KEY, KeptHistory, remove_empty_segments

RUN_LOGGER = "training.wandb_logger.RunWandbLogger"  # as config.yaml records it: keep this module path


class RunWandbLogger(KeptHistory, WandbLogger):
    """A WandbLogger that prints the offline "upload later" line only with the first metrics. Arguments are named,
    not **kwargs: jsonargparse would read WandbLogger's signature, whose annotations import wandb.

    Args:
        save_dir: The run directory; wandb's files go in its wandb/ folder.
        project: The wandb project.
        name: The run's name in wandb.
        id: The wandb run id every segment of the run logs to (None: a new one; older runs' configs lack it).
        offline: Log to files only, for `wandb sync` later.
        resume: wandb's resume mode.
    """

    def __init__(
        self,
        save_dir: str,
        project: str,
        name: str,
        id: str | None = None,
        offline: bool = False,
        resume: str = "allow",
    ) -> None:
        super().__init__(name=name, save_dir=save_dir, offline=offline, id=id, project=project, resume=resume)
        if self._wandb_init.get("anonymous") is None:
            # Lightning always passes anonymous=None, which wandb >= 0.2x warns about on every run.
            self._wandb_init.pop("anonymous", None)
        self.segment: Path | None = None  # the offline run folder this process created, if any
        self._links_before: dict[str, str] = {}  # wandb/'s links (latest-run, debug.log) before this segment
        self._trainer = None
        self._finished = False
        self._sync_hint: str | None = None

    def follow(self, trainer) -> None:
        """Log at `trainer.global_step`, as the console and the callbacks do, not at Lightning's step index."""
        self._trainer = trainer

    def _say_sync_hint(self) -> None:
        if self._sync_hint:
            rank_zero_info(self._sync_hint)
            self._sync_hint = None

    @rank_zero_only
    def log_metrics(self, metrics, step: int | None = None) -> None:
        self._say_sync_hint()
        if self._trainer is not None and self._trainer.state.fn == "fit":
            step = self._trainer.global_step
            metrics = self.keep_rows(step, metrics)
            if set(metrics) <= {"epoch"}:  # every point of this row is in an earlier segment already
                return
        super().log_metrics(metrics, step)

    def finalize(self, status: str) -> None:
        """Finish the wandb run here: wandb's own finish at exit ignores our settings."""
        if status == "success":  # a run too short to have logged metrics yet
            self._say_sync_hint()
        super().finalize(status)
        if self._experiment is not None and not self._finished:
            self._finished = True
            self._experiment.finish(exit_code=0 if status == "success" else 1)

    def discard_segment(self) -> None:
        """Remove the offline segment of a resume that failed before its first step: `wandb sync` would upload
        it, empty, into the run."""
        if self.segment is None or self._experiment is None:
            return
        if not self._finished:
            self._finished = True
            self._experiment.finish()
        shutil.rmtree(self.segment, ignore_errors=True)
        self._experiment, self.segment = None, None
        _restore_links(RunDir(Path(self._save_dir)).wandb, self._links_before)

    @property
    def experiment(self):
        created = self._experiment is None
        if created and rank_zero_only.rank == 0 and "settings" not in self._wandb_init:
            # Imported only now: its temp folders, which only its exit handler removes, go in the run's TMPDIR.
            import wandb

            # Offline, our one line says where the run is; online, wandb's lines give the run's URL.
            silent, colors = bool(self._offline), sys.stderr.isatty()
            self._wandb_init["settings"] = wandb.Settings(silent=silent, quiet=True, show_colors=colors)
        if created and self._save_dir:
            Path(self._save_dir).mkdir(parents=True, exist_ok=True)  # wandb warns about a missing folder
            if rank_zero_only.rank == 0:
                remove_empty_segments(Path(self._save_dir), rank_zero_info)
            self._links_before = _links(RunDir(Path(self._save_dir)).wandb)
        run = super().experiment
        if created and self._save_dir and getattr(run, "id", None):
            record_wandb_run_id(Path(self._save_dir), run.id)
        if created and self._offline and getattr(run, "dir", None):
            self.segment = folder = Path(run.dir).parent
            # Said with the first metrics: a run whose data setup fails has nothing to upload.
            self._sync_hint = f"wandb: no credentials (or WANDB_MODE=offline): logging offline. Upload later with: wandb sync {folder}"
        return run


def _links(folder: Path) -> dict[str, str]:
    """{name: target} of the symbolic links in `folder`, which wandb points at the newest segment."""
    if not folder.is_dir():
        return {}
    return {path.name: os.readlink(path) for path in folder.iterdir() if path.is_symlink()}


def _restore_links(folder: Path, links: dict[str, str]) -> None:
    """Make `folder`'s links `links` again: a discarded segment's would dangle."""
    for name, target in _links(folder).items():
        if links.get(name) != target:
            (folder / name).unlink()
    for name, target in links.items():
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(target)


def is_run_logger(logger) -> bool:
    """True for the `trainer.logger` entry of the wandb logger the CLI adds (as config.yaml records it)."""
    get = getattr(logger, "get", None)
    return callable(get) and get("class_path") == RUN_LOGGER


def run_logger(run_dir: Path, project: str, name: str, resumed: dict | None) -> dict:
    """The `trainer.logger` entry of a run: one wandb run across resumes (the `resumed` checkpoint's run id
    serves when the run directory lost its own)."""
    run_id = wandb_run_id(run_dir, (resumed or {}).get(WANDB_ID_KEY))
    where = {"save_dir": str(run_dir), "project": project, "name": name, "offline": wandb_offline()}
    return {"class_path": RUN_LOGGER, "init_args": {**where, "id": run_id, "resume": "allow"}}


def wandb_offline() -> bool:
    """Offline when WANDB_MODE says so, or when it is unset and no API key is in the environment or netrc."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun", "disabled")
    if os.environ.get("WANDB_API_KEY"):
        return False
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return not (path.is_file() and netrc.netrc(path).authenticators(host) is not None)
    except (netrc.NetrcParseError, OSError):
        return True


def wandb_run_id(run_dir: Path, fallback: str | None = None) -> str:
    """The wandb run id in `run_dir`'s `wandb_run_id` file, else `fallback` or a new one (the file is written once
    the wandb run exists: a failed start leaves no folder)."""
    path = RunDir(run_dir).wandb_id_file
    stored = path.read_text(encoding="utf-8").strip() if path.is_file() else ""
    # A new id has the shape of wandb's own: 8 lowercase letters and digits.
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    return stored or fallback or new


def record_wandb_run_id(run_dir: Path, run_id: str) -> None:
    path = RunDir(run_dir).wandb_id_file
    if not path.is_file():
        atomic_write(path, run_id + "\n")
