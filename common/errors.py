"""One base class for mistakes a user can fix, and the exit codes every command returns: 1 is a bug (with its
traceback), 2 a user mistake (one `error:` line naming the key, file or flag, and the fix)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_TERMINATED = 143  # SIGTERM, a scheduler's preemption

TRACEBACK_ENV = "GQA_GPT_TRACEBACK"


class UserError(ValueError):
    """A mistake in a config, flag, path, prompt, checkpoint or dataset, in one line naming it and the fix;
    commands catch `UserError` only, so any other exception is a bug and keeps its traceback."""


# Errors of the machine, not the program: a write that fails with one of these is one line, whoever wrote.
_DISK_FIXES = {
    errno.ENOSPC: "free disk space there",
    errno.EDQUOT: "free space within your disk quota there",
    errno.EROFS: "pick a folder on a writable filesystem",
    errno.EACCES: "make the folder writable or pick another",
    errno.EPERM: "make the folder writable or pick another",
}


class DiskError(UserError):
    """A file could not be written for a reason outside the program (full disk, quota, read-only folder)."""


def disk_error(
    err: BaseException | None, what: str = "cannot write", path: object = None
) -> DiskError | None:
    """The one-line DiskError for an OSError of `_DISK_FIXES` in `err` or its context chain (torch.save wraps it
    in a RuntimeError), else None. `path` names the file when the OSError does not (a failed write())."""
    while err is not None and not (isinstance(err, OSError) and err.errno in _DISK_FIXES):
        err = err.__cause__ or err.__context__
    if err is None:
        return None
    where = path or err.filename2 or err.filename  # of a copy's two names, the second is written
    return DiskError(f"{what}{f' {where}' if where else ''}: {err.strerror}; {_DISK_FIXES[err.errno]}")


class _NamedStdout:
    """sys.stdout while a command runs: an OSError of a print names no file, so the one line for `> /dev/full`
    (or a full disk behind a redirect) said "cannot write:" without saying what; this names it."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        return self._named(self._stream.flush)

    @staticmethod
    def _named(call, *args):
        try:
            return call(*args)
        except OSError as err:
            err.filename = err.filename or "standard output"
            raise

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose flag mistakes are one `error:` line and exit 2, like every other user mistake
    (argparse's own prints the whole usage block first); --help is argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {message} (see --help)\n")


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def first_line(error: BaseException) -> str:
    """The first line of an error message, to quote inside a one-line message."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def run_command(main: Callable[[], int | None]) -> int:
    """Run a command's `main`, turning user mistakes and Ctrl-C into one line and their exit codes
    (GQA_GPT_TRACEBACK=1 shows a user mistake's traceback too)."""
    stdout, sys.stdout = sys.stdout, _NamedStdout(sys.stdout)
    try:
        try:
            return main() or EXIT_OK
        except (OSError, RuntimeError) as err:  # a full disk, from any writer (wandb, Pillow, torch.save)
            disk = disk_error(err)
            if disk is None:
                raise
            raise disk from err
    except UserError as err:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"error: {first_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout = stdout
