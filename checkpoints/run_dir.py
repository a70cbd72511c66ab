"""Where things are on disk (`RunDir`), and which checkpoint a folder means: the newest one that passes the
reader's check (readable for generate.py and interop, resumable for a resume), with a warning for each newer one.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import torch

from common.errors import UserError, first_line

LAST_NAME = "last.ckpt"
STEP_FILE = re.compile(r"^step-(\d+)\.ckpt$")
SHARDED_META = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint folder
SHARDED_INDEX = ".metadata"  # torch.distributed.checkpoint's index of a sharded folder: which file holds what
T = TypeVar("T")


def _part(*names: str) -> property:
    return property(lambda self: self.path.joinpath(*names))


@dataclass(frozen=True)
class RunDir:
    """The parts of one run directory, by name; nothing is created or checked here."""

    path: Path

    def __post_init__(self) -> None:  # accept a str, and "~"
        object.__setattr__(self, "path", Path(self.path).expanduser())

    config = _part("config.yaml")  # the resolved config, written when training starts
    checkpoints = _part("checkpoints")  # step-<N>.ckpt files (or a sharded strategy's folders)
    last = _part("checkpoints", LAST_NAME)  # a hard link to the newest step file
    wandb_id_file = _part("wandb_run_id")  # the wandb run every resume of this directory logs to
    wandb = _part("wandb")  # wandb's own files
    attention = _part("attention")  # the attention explorer page
    lock = _part("writer.lock")  # held by the one process writing the run

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir:
        """The run a checkpoint belongs to: `runs/<run>/checkpoints/<file>` -> `runs/<run>`."""
        return cls(Path(checkpoint).expanduser().parent.parent)

    @property
    def temp(self) -> Path:
        """The writer's temp folder, in the system one: a short name, as Unix socket paths under it are limited."""
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"gqa-run-{digest}"

    def holds_checkpoints(self) -> bool:  # a run directory, unlike a sharded checkpoint folder
        return self.checkpoints.is_dir()


def step_file_name(step: int) -> str:
    return f"step-{step:08d}.ckpt"  # zero-padded: names sort by step


def step_files(folder: Path) -> dict[int, Path]:
    matches = ((STEP_FILE.match(path.name), path) for path in folder.iterdir()) if folder.is_dir() else ()
    return dict(sorted((int(match.group(1)), path) for match, path in matches if match))


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_META).is_file()


def checkpoint_dict_file(path: Path) -> Path:
    return path / SHARDED_META if is_sharded_checkpoint(path) else path


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
    """The global step a checkpoint holds, read without loading its tensors into memory."""
    try:
        file = checkpoint_dict_file(path)
        return int(torch.load(file, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # an unreadable checkpoint is reported by the real load, with its own message
        return None


def resume_candidates(checkpoint_dir: Path) -> list[Path]:
    """Checkpoints in `checkpoint_dir`, newest first: step files, a `last.ckpt` that links to none of them (after
    them: a kill between a step file and its re-link leaves it one save behind), then sharded folders."""
    if not checkpoint_dir.is_dir():
        return []
    steps = list(reversed(step_files(checkpoint_dir).values()))
    last = checkpoint_dir / LAST_NAME
    if last.is_file() and not any(last.samefile(p) for p in steps):
        steps.append(last)
    sharded = [p for p in checkpoint_dir.iterdir() if is_sharded_checkpoint(p)]
    # Lightning rewrites a sharded `last.ckpt` in place, so at equal steps the step-named folder comes first.
    sharded.sort(key=lambda path: (checkpoint_step(path) or -1, path.name != LAST_NAME), reverse=True)
    return steps + sharded


def choose_checkpoint(
    checkpoint_dir: Path, check: Callable[[Path], T], wording: Wording, warn: Callable[[str], None]
) -> tuple[Path, T] | None:
    """The newest checkpoint in `checkpoint_dir` that `check` accepts, and what it returned (None: no checkpoint).
    `warn` gets a line for each newer one that failed; none passing is NoGoodCheckpointError."""
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
