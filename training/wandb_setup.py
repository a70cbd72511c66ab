"""Choose between online and offline wandb logging without ever prompting for a login."""

from __future__ import annotations

import netrc
import os
import secrets
import string
from pathlib import Path
from urllib.parse import urlparse

from checkpoints.run_dir import RunDir
from common.files import atomic_write


def wandb_has_credentials() -> bool:
    """True when an API key is in the environment or in the netrc file `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def wandb_offline() -> bool:
    """Offline when WANDB_MODE says so, or when it is unset and no credentials are configured."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun", "disabled")
    return not wandb_has_credentials()


def wandb_run_id(run_dir: Path, fallback: str | None = None) -> str:
    """The wandb run id of `run_dir` (its `wandb_run_id` file), so every resume logs to the same run.

    A run directory without the file takes `fallback` (the id stored in the checkpoint being resumed) or a
    new id. Nothing is written here: `record_wandb_run_id` does that once the wandb run exists, so a run that
    fails before it starts leaves no folder behind.
    """
    path = RunDir(run_dir).wandb_id_file
    if path.is_file():
        stored = path.read_text(encoding="utf-8").strip()
        if stored:
            return stored
    if fallback is None:  # the shape of wandb's own ids: 8 lowercase letters and digits
        fallback = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    return fallback


def record_wandb_run_id(run_dir: Path, run_id: str) -> None:
    """Keep `run_id` in `run_dir/wandb_run_id` (once) for the resumes to come."""
    path = RunDir(run_dir).wandb_id_file
    if not path.is_file():
        atomic_write(path, run_id + "\n")
