"""Saving checkpoints on a background thread, with the synchronous save's guarantees: training only snapshots the
tensors; unlike Lightning's `AsyncCheckpointIO` (an unbounded queue), a save first waits for the previous one, and
a failed save raises on the training thread at the next call or at teardown."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from .atomic_io import AtomicCheckpointIO


class BackgroundCheckpointIO(CheckpointIO):
    """Runs an `AtomicCheckpointIO` on one writer thread."""

    def __init__(self, keep_last: int = 2) -> None:
        self.inner = AtomicCheckpointIO(keep_last=keep_last)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        self.wait()
        snapshot = apply_to_collection(checkpoint, torch.Tensor, lambda t: t.detach().clone())
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = self._executor.submit(self.inner.save_checkpoint, snapshot, path, storage_options)

    def wait(self) -> None:
        """Block until the save in flight is on disk; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict:
        self.wait()
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: str | Path) -> None:
        self.wait()  # in order with the saves
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        """Finish the save in flight (Lightning calls this when fit ends, also after an exception)."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
