"""Which checkpoint `--ckpt_path last` resumes: the newest one that is whole, with a warning for each bad one."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

from common.errors import UserError, first_line
from model.checkpoint import (
    CheckpointError,
    is_sharded_checkpoint,
    load_checkpoint,
    read_checkpoint,
    sharded_contents,
)

from .checkpoint_io import LAST_NAME, step_files
from .resume import checkpoint_step

# What Lightning needs to continue a run exactly; a checkpoint without them is not resumable.
RESUME_KEYS = ("global_step", "state_dict", "optimizer_states", "loops")


class NoGoodCheckpointError(UserError):
    """Every checkpoint in the folder is unreadable or incomplete."""


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


def check_resumable(path: Path) -> None:
    """Raise CheckpointError unless `path` is intact, ours, and holds what resuming needs.

    A file's zip CRCs are checked and its weights loaded. A sharded folder's weights and optimizer states stay in
    its shard files, unread: the index must name both and every shard file must be there.
    """
    sharded = is_sharded_checkpoint(path)
    if sharded:  # the index must name the weights and optimizer states kept in the shard files
        held = sharded_contents(path)
        not_in_shards = [key for key in ("state_dict", "optimizer_0") if key not in held]
        needed = [key for key in RESUME_KEYS if key not in ("state_dict", "optimizer_states")]
    else:
        _check_zip(path)
        not_in_shards, needed = [], list(RESUME_KEYS)
    ckpt, _ = read_checkpoint(path)
    missing = [key for key in needed if key not in ckpt] + not_in_shards
    if missing:
        raise CheckpointError(f"{path}: lacks {', '.join(missing)}; it cannot resume training")
    del ckpt
    if not sharded:  # our format's own checks: metadata, tokenizer digest, weights that fit the config
        load_checkpoint(path)


def _check_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(
            path
        ) as archive:  # torch.load does not check the CRCs: flipped bytes load silently
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: not a complete checkpoint ({first_line(err)})") from err
    if bad_member is not None:
        raise CheckpointError(f"{path}: checksum mismatch in {bad_member}; the file is corrupt")


def choose_resume_checkpoint(checkpoint_dir: str | Path, warn: Callable[[str], None] = print) -> Path | None:
    """The newest resumable checkpoint in `checkpoint_dir`, or None when the folder holds no checkpoint.

    When a newer checkpoint fails `check_resumable`, `warn` gets one line naming it and the file used instead.
    When none is resumable, raises NoGoodCheckpointError (one line) and touches nothing.
    """
    checkpoint_dir = Path(checkpoint_dir)
    candidates = resume_candidates(checkpoint_dir)
    if not candidates:
        return None
    bad: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            check_resumable(path)
        except CheckpointError as err:
            bad.append((path, first_line(err).removeprefix(f"{path}: ")))
            continue
        for bad_path, reason in bad:
            warn(f"warning: {bad_path} cannot be resumed ({reason}); resuming from {path.name} instead")
        return path
    newest, reason = bad[0]
    raise NoGoodCheckpointError(
        f"no checkpoint in {checkpoint_dir} can resume training (newest {newest.name}: {reason}; "
        f"{len(bad)} checked); pass a good file with --ckpt_path or start a new run with --run_name"
    )
