"""Which checkpoint a folder means: the newest one that is whole, with a warning line for each newer bad one.

One rule for every reader of a run directory: generate.py, the exports and interop read its newest readable
checkpoint (checkpoints.format), `fit --ckpt_path last` or `--ckpt_path <run dir>` resume from its newest
resumable one (checkpoints.resume). Only the check differs: resuming also needs the optimizer and loop states.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

import torch

from common.errors import UserError, first_line

from .run_dir import LAST_NAME, checkpoint_dict_file, is_sharded_checkpoint, step_files

T = TypeVar("T")


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or not one of ours; the message is one line naming the file."""


class NoGoodCheckpointError(CheckpointError):
    """Every checkpoint in the folder is unreadable or incomplete."""


class Wording(NamedTuple):
    """How the warnings and the error of one use of `choose_checkpoint` read."""

    bad: str  # after the path of a checkpoint that failed: "cannot be resumed"
    using: str  # before the name of the one used instead: "resuming from"
    none: str  # the error when none passes; fields {folder}, {newest} (path), {name}, {reason}, {count}


def checkpoint_step(path: Path) -> int | None:
    """The global step a checkpoint file or sharded folder holds, read without loading its tensors into memory."""
    try:
        file = checkpoint_dict_file(path)
        return int(torch.load(file, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # an unreadable checkpoint is reported by the real load, with its own message
        return None


def resume_candidates(checkpoint_dir: Path) -> list[Path]:
    """Checkpoints in `checkpoint_dir`, newest first: step files by step, then a `last.ckpt` that is not one of
    them, then sharded checkpoint folders.

    `last.ckpt` is normally a hard link to the newest step file; it is listed on its own only when it is a
    separate file (a run from before step files, or a copy), and then after the step files, since a kill
    between writing a step file and re-linking `last.ckpt` leaves `last.ckpt` one save behind.
    """
    steps = list(reversed(step_files(checkpoint_dir).values()))
    last = checkpoint_dir / LAST_NAME
    if last.is_file() and not any(last.samefile(p) for p in steps):
        steps.append(last)
    return steps + sharded_folders(checkpoint_dir)


def sharded_folders(checkpoint_dir: Path) -> list[Path]:
    """The sharded checkpoint folders of a run (a sharded strategy writes no step files), newest step first.

    Lightning rewrites a sharded `last.ckpt` in place, so at equal steps the step-named folder comes first.
    """
    if not checkpoint_dir.is_dir():
        return []
    folders = [path for path in checkpoint_dir.iterdir() if is_sharded_checkpoint(path)]
    return sorted(
        folders, key=lambda path: (checkpoint_step(path) or -1, path.name != LAST_NAME), reverse=True
    )


def choose_checkpoint(
    checkpoint_dir: Path, check: Callable[[Path], T], wording: Wording, warn: Callable[[str], None]
) -> tuple[Path, T] | None:
    """The newest checkpoint in `checkpoint_dir` that `check` accepts, with what `check` returned for it.

    None when the folder holds no checkpoint. When a newer one fails `check` (a CheckpointError),
    `warn` gets one line naming it and the one used instead; when none passes, NoGoodCheckpointError (one line).
    """
    candidates = resume_candidates(checkpoint_dir)
    if not candidates:
        return None
    bad: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            result = check(path)
        except CheckpointError as err:
            bad.append((path, first_line(err).removeprefix(f"{path}: ")))
            continue
        for bad_path, reason in bad:
            warn(f"warning: {bad_path} {wording.bad} ({reason}); {wording.using} {path.name} instead")
        return path, result
    newest, reason = bad[0]
    fields = {"folder": checkpoint_dir, "newest": newest, "name": newest.name, "reason": reason}
    raise NoGoodCheckpointError(wording.none.format(**fields, count=len(bad)))
