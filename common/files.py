"""Atomic file and folder writes (a reader sees the old version or the new one, never a partial one), and the
check every command makes on an output path before working (`refuse_existing`). Temporaries live in the
destination's folder, so the final rename stays on one filesystem, and hold TEMP_MARK, so a kill's are found.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import UserError

TEMP_MARK = ".partial-"
_OWNER = re.compile(rf"{re.escape(TEMP_MARK)}(\d+)@(.+)-[0-9a-f]+$")


def temp_path_for(path: Path) -> Path:
    """A unique temporary name next to `path` that names its owner."""
    return path.with_name(
        f".{path.name}{TEMP_MARK}{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    )


def owner_has_exited(temp: Path) -> bool:
    """Whether the process that made this temporary name ran on this host and has exited (or is a zombie): in
    folders shared by concurrent runs (the data cache), only a dead owner's leftovers may go."""
    owner = _OWNER.search(temp.name)
    if owner is None or owner.group(2) != socket.gethostname():
        return False
    pid = int(owner.group(1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    # Exited but not reaped (state Z, which a container's init may never reap): it answers a signal, never writes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # reaped since the signal (exited), or no /proc here (not Linux: as before)
        return Path("/proc/self").exists()
    except OSError:
        return False
    # The state follows the command name in brackets, which may itself hold ") ".
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to `path` (a symlink's target) for a writer that opens the file itself; it replaces
    `path` on a clean exit and is removed on an error."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, content: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write bytes, UTF-8 text, or what a function writes to a binary file, atomically. A writer that must
    survive a power loss fsyncs the file, then calls `fsync_dir`."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        if callable(content):
            content(f)
        else:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(path)


class OutputPathError(UserError):
    """An output path that a command cannot write as asked."""


def refuse_existing(
    out: Path,
    force: bool,
    *,
    file: bool = False,
    flag: str = "--out",
    suffixes: tuple[str, ...] = (),
    source: Path | None = None,
) -> Path:
    """Refuse, before any work, an output that cannot be written or would replace something without `force`
    (with `file`, a folder too), or that overlaps `source`, the input it is made from; returns what it names
    (a symlink's target)."""
    if suffixes and out.suffix.lower() not in suffixes:
        example = out.with_suffix(suffixes[0]).name
        raise OutputPathError(f"{flag} {out}: expected a {' or '.join(suffixes)} file, e.g. {example}")
    if source is not None:  # before the --force advice: --force would not make this right
        refuse_overlap(out, source, flag)
    target = out.resolve() if out.is_symlink() else out
    if file and target.is_dir():
        raise OutputPathError(f"{flag} {out} is a folder; pass the path of a file in it")
    if target.exists() and not (target.is_file() or target.is_dir()):
        raise OutputPathError(
            f"{flag} {out} is not a regular file (a device, FIFO or socket); pass a file path"
        )
    if target.exists() and not force:
        raise OutputPathError(f"{flag} {out} already exists; pass --force to replace it")
    refuse_unwritable_folder(target.parent, flag)
    return target


def refuse_overlap(out: Path, source: Path, flag: str) -> None:
    """Refuse an output that is `source`, holds it, or is something already inside it: writing it (with --force,
    replacing it) would destroy or change the input being read. A new file inside a source folder (a GGUF in
    its run folder) is fine. Compared after resolving symlinks; a `source` that is no local path (a Hub id)
    cannot overlap."""
    if not source.exists():
        return
    out_real, source_real = Path(os.path.realpath(out)), Path(os.path.realpath(source))
    if out_real == source_real:
        where = "is"
    elif out_real in source_real.parents:
        where = "holds"
    elif source_real in out_real.parents and out_real.exists():
        where = "is inside"
    else:
        return
    raise OutputPathError(f"{flag} {out} {where} {source}, the input being read; pick a path outside it")


def missing_folders(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, innermost first: what making `path` would create."""
    return [folder for folder in (path, *path.parents) if not folder.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """Take away each of `folders` (innermost first) that is empty, after a failed start made them: one that
    another process has begun to fill, or that keeps what a killed build leaves for the next, stays."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty, or gone
            folder.rmdir()


def refuse_unwritable_folder(folder: Path, flag: str) -> None:
    """Refuse a `folder` (or nearest existing parent) where no file can be made. A real file is made and removed:
    permission bits do not tell (root passes them, /proc refuses root)."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"{flag}: {existing} is a file, not a folder; pass a path in a folder")
    probe = temp_path_for(existing / "probe")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError as err:
        raise OutputPathError(
            f"{flag}: cannot write in {existing} ({err.strerror}); pass a writable path"
        ) from None
    probe.unlink()


class StagedFolder:
    """A folder built under a temporary name inside `parent` and published by one rename; on leaving the block an
    unpublished one is deleted, and so is `parent` if this made it and it is left empty."""

    def __init__(self, parent: str | Path) -> None:
        self.parent = Path(parent)
        self.path: Path | None = None
        self._made_parent = False

    def __enter__(self) -> StagedFolder:
        self._made_parent = not self.parent.exists()
        self.parent.mkdir(parents=True, exist_ok=True)
        self.path = temp_path_for(self.parent / "staging")
        self.path.mkdir()
        return self

    def publish(self, name: str, *, replace: bool = False) -> Path:
        """Rename the folder to `parent/name`; OSError if that exists, unless `replace` swaps it out."""
        assert self.path is not None, "publish() outside the with-block"
        final = self.parent / name
        old = temp_path_for(final) if replace and final.exists() else None
        if old is not None:
            final.rename(old)
        try:
            os.rename(self.path, final)
        except BaseException:
            if old is not None:
                old.rename(final)
            raise
        self.path = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(self.parent)
        return final

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
        if self._made_parent and not any(self.parent.iterdir()):
            self.parent.rmdir()


def stale_temp_files(folder: str | Path) -> list[Path]:
    """Temporary files and folders that writers left in `folder` when killed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(".") and TEMP_MARK in p.name)


def remove_stale(stale: list[Path], folder: Path, what: str, say: Callable[[str], None]) -> list[Path]:
    """Delete `stale` (what killed runs left in `folder`) and `say` one line naming them; returns `stale`."""
    if not stale:
        return []
    freed = sum(_remove(path) for path in stale)
    names = ", ".join(p.name for p in stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
    say(f"removed {len(stale)} {what}(s) left by killed runs in {folder} ({freed / 1e6:.1f} MB): {names}")
    return list(stale)


def _remove(path: Path) -> int:
    """The bytes freed by deleting a file or folder (0 if it vanished meanwhile)."""
    try:
        if path.is_dir() and not path.is_symlink():
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
        else:
            size = path.stat().st_size
            path.unlink()
    except FileNotFoundError:
        return 0
    return size
