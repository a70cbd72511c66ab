"""The error type for data settings a user can fix."""

from common.errors import UserError


class DataConfigError(UserError):
    """A data setting the user can fix.

    The message is one line that names the `data.*` key (or the file) and says what to change, so every
    command prints it without a traceback (exit code 2).
    """
