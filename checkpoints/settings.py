"""The checkpoint settings of train.py: the `checkpoint.*` keys, the CheckpointIO they select, start-up checks."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from .atomic_io import AtomicCheckpointIO
from .background_io import BackgroundCheckpointIO
from .resume import choose_resume_checkpoint

# Where our CheckpointIOs lived before this package: the config.yaml of an older run still names them.
FORMER_CLASS_PATHS = {
    "training.checkpoint_io.AtomicCheckpointIO",
    "training.async_checkpoint_io.BackgroundCheckpointIO",
}


class GPTCheckpoint(ModelCheckpoint):
    """ModelCheckpoint plus the two settings of the CheckpointIO that train.py installs.

    Args:
        keep_last: How many step-named checkpoints (`step-<N>.ckpt`) to keep; `last.ckpt` links to the newest.
        async_save: Write checkpoints on a background thread; training stalls only to copy the tensors in memory.
    """

    def __init__(self, keep_last: int = 2, async_save: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keep_last = keep_last
        self.async_save = async_save


def checkpoint_io_class(async_save: bool) -> type[CheckpointIO]:
    """The one choice of CheckpointIO: atomic step files, written in the background with `async_save`."""
    return BackgroundCheckpointIO if async_save else AtomicCheckpointIO


def checkpoint_io(keep_last: int = 2, async_save: bool = False) -> CheckpointIO:
    """An instance of the CheckpointIO for these settings (for a Trainer built in code, as the benchmarks do)."""
    return checkpoint_io_class(async_save)(keep_last=keep_last)


def checkpoint_io_config(keep_last: int, async_save: bool) -> dict:
    """The same CheckpointIO as a `trainer.plugins` entry the CLI instantiates."""
    return {"class_path": _class_path(checkpoint_io_class(async_save)), "init_args": {"keep_last": keep_last}}


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def with_checkpoint_io(plugins: Any, keep_last: int, async_save: bool) -> list:
    """`trainer.plugins` with our CheckpointIO for these settings (replacing ours from a saved config.yaml)."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list) else [plugins]
    ours = {_class_path(checkpoint_io_class(flag)) for flag in (False, True)} | FORMER_CLASS_PATHS
    plugins = [p for p in plugins if str(getattr(p, "class_path", None) or _get(p, "class_path")) not in ours]
    if any("CheckpointIO" in str(getattr(p, "class_path", None) or _get(p, "class_path")) for p in plugins):
        return plugins  # the config chose another CheckpointIO on purpose
    return [*plugins, checkpoint_io_config(keep_last, async_save)]


def _get(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, dict) else None


def resolve_ckpt_path(
    checkpoint_dir: Path, ckpt_path: str | None, say: Callable[[str], None] | None = None
) -> str | None:
    """Resolve `ckpt_path="last"` to the newest resumable file in `checkpoint_dir` (None: start fresh).

    Raises a UserError when none is resumable. Only reads: the sweep waits for the run's lock (run_lock).
    """
    say = say or (lambda line: print(line, file=sys.stderr))
    if ckpt_path != "last":
        return ckpt_path
    chosen = choose_resume_checkpoint(
        checkpoint_dir, warn=say if rank_zero_only.rank == 0 else lambda _: None
    )
    if chosen is None:
        say(f"--ckpt_path last: no checkpoint in {checkpoint_dir} yet; starting from step 0")
        return None
    return str(chosen)
