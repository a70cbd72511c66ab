"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

The temporary file lives in the destination's own folder (never the system temp directory), so the final
`os.replace` is a rename on one filesystem, which is atomic on POSIX filesystems, NFS and Lustre included.
Its name starts with `.` and contains TEMP_MARK, so `stale_temp_files` can find what a killed process left.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

TEMP_MARK = ".partial-"


def temp_path_for(path: Path) -> Path:
    """A unique temporary name next to `path`."""
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, content: bytes | str | Callable[[BinaryIO], None], *, durable: bool = False) -> Path:
    """Write `content` (bytes, text as UTF-8, or a function that writes to a binary file) to `path` atomically.

    durable=True also fsyncs the file before the rename and the folder after it, so the new file survives a
    power loss or a killed node (checkpoints). The file gets the usual permissions (0666 minus the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `path` for a writer that insists on opening the file itself.

    On a clean exit the temporary file replaces `path` (as `atomic_write` does); on any error it is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def stale_temp_files(folder: str | Path) -> list[Path]:
    """Temporary files (and folders) that `atomic_write`-style writers left in `folder` when killed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(".") and TEMP_MARK in p.name)
