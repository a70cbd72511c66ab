"""The checkpoint settings of train.py: the `checkpoint.*` keys, the CheckpointIO they select, the resume choice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from common.errors import to_stderr

from .atomic_io import AtomicCheckpointIO
from .background_io import BackgroundCheckpointIO
from .resume import RESUMING, check_resumable
from .run_dir import choose_checkpoint


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


def checkpoint_io(keep_last: int = 2, async_save: bool = False) -> CheckpointIO:
    """The CheckpointIO for these settings (for a Trainer built in code, as the benchmarks do)."""
    return (BackgroundCheckpointIO if async_save else AtomicCheckpointIO)(keep_last=keep_last)


def with_checkpoint_io(plugins: Any, keep_last: int, async_save: bool) -> list:
    """`trainer.plugins` with our CheckpointIO for these settings (replacing ours from a saved config.yaml)."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list) else [plugins]
    ours = [f"{cls.__module__}.{cls.__qualname__}" for cls in (AtomicCheckpointIO, BackgroundCheckpointIO)]

    def class_path(entry: Any) -> str:  # a config's dict or Namespace, or a plugin built in code
        if isinstance(entry, dict):
            return str(entry.get("class_path"))
        return getattr(entry, "class_path", None) or f"{type(entry).__module__}.{type(entry).__qualname__}"

    plugins = [p for p in plugins if class_path(p) not in ours]
    if any("CheckpointIO" in class_path(p) for p in plugins):
        return plugins  # the config chose another CheckpointIO on purpose
    return [*plugins, {"class_path": ours[1 if async_save else 0], "init_args": {"keep_last": keep_last}}]


def resume_last(
    checkpoint_dir: Path, say: Callable[[str], None] = to_stderr
) -> tuple[str | None, dict | None]:
    """`--ckpt_path last`: the newest resumable checkpoint and its dict, (None, None) when there is none yet.
    Only reads: the sweep waits for the run's lock (run_lock)."""
    warn = say if rank_zero_only.rank == 0 else lambda _: None
    chosen = choose_checkpoint(Path(checkpoint_dir), check_resumable, RESUMING, warn)
    if chosen is None:
        say(f"--ckpt_path last: no checkpoint in {checkpoint_dir} yet; starting from step 0")
        return None, None
    return str(chosen[0]), chosen[1]
