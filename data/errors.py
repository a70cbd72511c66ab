"""The one error type users see for data settings they can fix."""


class DataConfigError(ValueError):
    """A data setting the user can fix.

    The message is one line that names the `data.*` key (or the file) and says what to change, so the CLI can
    print it without a traceback.
    """


def first_line(error: BaseException) -> str:
    """The first line of an error message, to quote inside our own one-line messages."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
