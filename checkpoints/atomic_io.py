"""Checkpoints that survive `kill -9` (docs/runs.md): step-named files written atomically and fsynced, `last.ckpt`
a hard link to the newest (a link never dangles when an old step file goes; where the filesystem refuses one, a
durable copy). A kill leaves at most a temporary file, which the next lock holder removes (run_lock)."""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from common.errors import UserError, disk_error
from common.files import atomic_write, fsync_dir, temp_path_for

from .run_dir import LAST_NAME, step_file_name, step_files

# Test hook: "<phase>@<n>" makes the n-th save of this process SIGKILL itself at <phase> (fault injection).
FAULT_ENV = "GQA_GPT_CHECKPOINT_FAULT"
PHASES = ("before_write", "mid_write", "before_rename", "before_dir_fsync", "before_last_link",
          "before_last_replace")  # fmt: skip


class CheckpointSaveError(UserError):
    """A save failed for a reason the user can fix (disk full, permissions); the previous checkpoint is intact."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: atomic, durable writes; `last.ckpt` -> newest of `keep_last` step files."""

    def __init__(self, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise UserError(f"checkpoint.keep_last: must be at least 1, got {keep_last}")
        self.keep_last = keep_last
        self.saves = 0
        self._fault = _parse_fault(os.environ.get(FAULT_ENV))

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        self.saves += 1
        # Anything but last.ckpt (a top-k checkpoint): the same atomic write, no rotation.
        rotate = path.name == LAST_NAME
        target = path.with_name(step_file_name(int(checkpoint["global_step"]))) if rotate else path
        try:
            self._write(checkpoint, target)
            if rotate:
                self._point_last_at(target, path)
                self._prune(path.parent, int(checkpoint["global_step"]))
        except (OSError, RuntimeError) as err:  # torch.save wraps a failed write in a RuntimeError
            disk = disk_error(err, "cannot save checkpoint", target)
            if disk is None:
                raise
            raise CheckpointSaveError(f"{disk} (earlier checkpoints are intact)") from err

    def remove_checkpoint(self, path: str | Path) -> None:  # ModelCheckpoint's call for top-k files it drops
        Path(path).unlink(missing_ok=True)

    def _write(self, checkpoint: dict[str, Any], path: Path) -> None:
        def write(f: BinaryIO) -> None:
            self._fault_point("before_write")
            if self._armed("mid_write"):
                buffer = io.BytesIO()  # half its bytes reach the temp file, as a kill mid-write leaves them
                torch.save(checkpoint, buffer)
                f.write(buffer.getbuffer()[: buffer.tell() // 2])
                f.flush()
                self._fault_point("mid_write")
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
            self._fault_point("before_rename")

        atomic_write(path, write)
        self._fault_point("before_dir_fsync")
        fsync_dir(path.parent)

    def _point_last_at(self, step_path: Path, last: Path) -> None:
        self._fault_point("before_last_link")
        tmp = temp_path_for(last)
        try:
            try:
                os.link(step_path, tmp)
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK, errno.EOPNOTSUPP):
                    raise
                _durable_copy(step_path, tmp)
            self._fault_point("before_last_replace")
            os.replace(tmp, last)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(last.parent)

    def _prune(self, folder: Path, step: int) -> None:
        files = step_files(folder)
        # Files past `step` are from a branch abandoned by resuming an earlier checkpoint: this run rewrites them.
        stale = [path for s, path in files.items() if s > step]
        kept = [path for s, path in files.items() if s <= step]
        for path in stale + kept[: -self.keep_last]:
            path.unlink(missing_ok=True)

    def _armed(self, phase: str) -> bool:
        return self._fault is not None and self._fault == (phase, self.saves)

    def _fault_point(self, phase: str) -> None:
        if self._armed(phase):
            os.kill(os.getpid(), signal.SIGKILL)


def _durable_copy(source: Path, target: Path) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, length=16 << 20)
        dst.flush()
        os.fsync(dst.fileno())


def _parse_fault(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    phase, _, count = spec.partition("@")
    if phase not in PHASES or not count.isdigit():
        raise UserError(
            f"{FAULT_ENV}={spec!r}: expected <phase>@<save number>, phase one of {', '.join(PHASES)}"
        )
    return phase, int(count)
