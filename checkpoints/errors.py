"""The one-line errors of reading checkpoints (both are UserErrors: exit code 2, no traceback)."""

from __future__ import annotations

from common.errors import UserError


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or not one of ours; the message is one line naming the file."""


class NoGoodCheckpointError(CheckpointError):
    """Every checkpoint in the folder is unreadable or incomplete."""
