"""One base class for mistakes a user can fix, and the exit codes every command returns.

| code | meaning |
|------|---------|
| 0    | success |
| 1    | internal error (a bug): the traceback is shown |
| 2    | a mistake the user can fix: one `error:` line naming the key, file or flag, and the fix |
| 130  | stopped by Ctrl-C (SIGINT) |
| 143  | stopped by SIGTERM (a scheduler's preemption) |
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

TRACEBACK_ENV = "GQA_GPT_TRACEBACK"


class UserError(ValueError):
    """A mistake in a config, flag, path, prompt, checkpoint or dataset that the user can fix.

    The message is one line that names what is wrong and how to fix it. It subclasses ValueError so code that
    validates values can be caught as such; commands catch `UserError` only, so any other exception is a bug
    and keeps its traceback.
    """


def first_line(error: BaseException) -> str:
    """The first line of an error message, to quote inside a one-line message."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def run_command(main: Callable[[], int | None]) -> int:
    """Run a command's `main`, turning user mistakes and Ctrl-C into one line and their exit codes.

    Set GQA_GPT_TRACEBACK=1 to see the traceback of a user mistake too.
    """
    try:
        return main() or EXIT_OK
    except UserError as err:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"error: {first_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
