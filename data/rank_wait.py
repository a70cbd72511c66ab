"""One process per node builds the data; the others wait on its published file, never on a process group.

Lightning runs `LightningDataModule.setup` on every rank between two process-group barriers (pre_setup and
post_setup), and a barrier gives up after the group's timeout (30 minutes by default). So the data work is
done inside `setup`: local rank 0 builds, the other ranks poll for the published folder, and all of them reach
the next barrier within a poll interval of each other, however long the build took. A build that fails leaves a
note with its one-line error, so the waiting ranks stop with the same message instead of waiting for ever.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from common.errors import UserError, first_line
from common.files import atomic_write
from data import DataConfigError

POLL_S = 0.2
REPORT_EVERY_S = 60.0


def build_or_wait(
    find: Callable[[], Path | None],
    build: Callable[[], Path],
    *,
    builder: bool,
    others_wait: bool,
    failure_note: Path,
    started: float,
    what: str,
) -> Path:
    """`find()` if it finds the result; else `build()` on the builder and wait for `find()` elsewhere."""
    found = find()
    if found is not None:
        return found
    if builder:
        try:
            return build()
        except BaseException as error:
            if not others_wait:
                raise
            reason = (
                str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {first_line(error)}"
            )
            atomic_write(failure_note, reason or type(error).__name__)
            raise
    return _wait(find, failure_note, started, what)


def _wait(find: Callable[[], Path | None], failure_note: Path, started: float, what: str) -> Path:
    began = last_report = time.monotonic()
    while (found := find()) is None:
        # Only a note written after this process started belongs to this run.
        if failure_note.is_file() and failure_note.stat().st_mtime >= started - 1:
            raise DataConfigError(f"{what}: local rank 0 failed: {failure_note.read_text(encoding='utf-8')}")
        if time.monotonic() - last_report >= REPORT_EVERY_S:
            last_report = time.monotonic()
            print(f"waiting for local rank 0 to build {what} ({last_report - began:.0f} s)", file=sys.stderr)
        time.sleep(POLL_S)
    return found
