"""One writer per run directory: an `fcntl.flock` on RunDir.lock, which the kernel drops however its holder exits
(kill -9 included). Two `fit`s on one run would mix their checkpoints and wandb segments, and one's start-up
sweep would delete the other's temporary file; so the writer (global rank 0) sweeps only once it holds the lock.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from common.errors import UserError, to_stderr
from common.files import remove_stale, stale_temp_files

from .run_dir import RunDir

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there stay unguarded
    fcntl = None


# A Unix socket's path holds at most 107 bytes; multiprocessing's are <TMPDIR>/pymp-<8>/listener-<8>.
MAX_SOCKET_PATH = 107
SOCKET_IN_TEMP = "/pymp-12345678/listener-12345678"


class RunDirBusyError(UserError):
    """Another live process is writing this run directory."""


class RunDirLock:
    """The held lock of one run directory; `release` (or the process's end) frees it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = RunDir(run_dir)
        self._fd: int | None = None
        self._previous_temp: tuple[str | None, str | None] | None = None

    def acquire(self) -> RunDirLock:
        path = self.run_dir.lock
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise RunDirBusyError(
                f"{self.run_dir.path} is being written by {holder}; wait for that run to end (or stop it), "
                "or train into another folder with --run_name"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def use_run_temp(self, say: Callable[[str], None]) -> None:
        """Point this process and its children at RunDir.temp, emptied first: wandb and multiprocessing clean up
        at an exit a killed process never reaches, and under the run's lock what is left there is a dead writer's."""
        temp = self.temp = self.run_dir.temp  # kept: RunDir.temp changes once TMPDIR is switched below
        if temp.exists():
            left = sum(1 for _ in temp.iterdir())
            shutil.rmtree(temp, ignore_errors=True)
            if left:
                say(f"removed {left} temporary folder(s) left by killed runs in {temp}")
        temp.mkdir(parents=True)
        # torch.compile's cache stays where it was (it is keyed by user, not by run, and costs minutes to redo).
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
        if len(str(temp)) + len(SOCKET_IN_TEMP) > MAX_SOCKET_PATH:
            # DataLoader workers share tensors through a Unix socket in multiprocessing's folder under TMPDIR;
            # too long a path and their first batch never comes. Made now, that folder stays in the system one.
            multiprocessing.util.get_temp_dir()
        self._previous_temp = (tempfile.tempdir, os.environ.get("TMPDIR"))
        tempfile.tempdir, os.environ["TMPDIR"] = str(temp), str(temp)

    def release(self) -> None:
        """Drop the lock and go back to the system temp folder; the run's goes at exit, after multiprocessing's
        finalizer (priority -100) removed its own folder inside it."""
        if self._previous_temp is not None:
            tempfile.tempdir, previous = self._previous_temp
            if previous is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = previous
            multiprocessing.util.Finalize(
                None, shutil.rmtree, args=(self.temp,), kwargs={"ignore_errors": True}, exitpriority=-101
            )
            self._previous_temp = None
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def own_run_dir(run_dir: str | Path, say: Callable[[str], None] = to_stderr) -> RunDirLock:
    """Become the one writer of `run_dir` before anything saves: lock it, remove killed writers' temporary
    checkpoint files, and use the run's own temp folder; `release` undoes all three."""
    lock = RunDirLock(run_dir).acquire()
    checkpoints = RunDir(run_dir).checkpoints
    try:
        remove_stale(stale_temp_files(checkpoints), checkpoints, "temporary checkpoint file", say)
        lock.use_run_temp(say)
    except BaseException:
        lock.release()  # the caller gets no lock to release
        raise
    return lock
