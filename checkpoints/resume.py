"""Resuming: which checkpoint can continue a run, and `python train.py fit --ckpt_path runs/<run>`.

A run directory holds `config.yaml` (the fully resolved config, written when the run's training starts) and
`checkpoints/`. Resuming from the directory reads that config first, so no override given to the first run
(data.data_files, model sizes, ...) has to be repeated; anything else on the command line is applied on top
of it, as usual. The checkpoint is the newest resumable one (checkpoints.choice), for `--ckpt_path last` too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from common.errors import UserError

from .choice import CheckpointError, Wording, choose_checkpoint
from .format import loaded_from, read_checkpoint, sharded_contents
from .run_dir import RunDir, is_sharded_checkpoint

CKPT_FLAG = "--ckpt_path"
# What Lightning needs to continue a run exactly; a checkpoint without them is not resumable.
RESUME_KEYS = ("global_step", "state_dict", "optimizer_states", "loops")
RESUMING = Wording(
    bad="cannot be resumed",
    using="resuming from",
    none="no checkpoint in {folder} can resume training (newest {name}: {reason}; {count} checked); pass a "
    "good file with --ckpt_path or start a new run with --run_name",
)


def check_resumable(path: Path) -> None:
    """Raise CheckpointError unless `path` is intact, ours, and holds what resuming needs.

    A file's zip CRCs are checked (checkpoints.format) and its weights loaded. A sharded folder's weights and
    optimizer states stay in its shard files, unread: the index must name both and every shard file must be there.
    """
    sharded = is_sharded_checkpoint(path)
    if sharded:  # the index must name the weights and optimizer states kept in the shard files
        held = sharded_contents(path)
        not_in_shards = [key for key in ("state_dict", "optimizer_0") if key not in held]
        needed = [key for key in RESUME_KEYS if key not in ("state_dict", "optimizer_states")]
    else:
        not_in_shards, needed = [], list(RESUME_KEYS)
    ckpt, _ = read_checkpoint(path)
    missing = [key for key in needed if key not in ckpt] + not_in_shards
    if missing:
        raise CheckpointError(f"{path}: lacks {', '.join(missing)}; it cannot resume training")
    if not sharded:  # weights that fit the config
        loaded_from(ckpt, path)


def choose_resume_checkpoint(checkpoint_dir: str | Path, warn: Callable[[str], None] = print) -> Path | None:
    """The newest resumable checkpoint in `checkpoint_dir`, or None when the folder holds no checkpoint.

    When a newer checkpoint fails `check_resumable`, `warn` gets one line naming it and the file used instead.
    When none is resumable, raises NoGoodCheckpointError (one line) and touches nothing.
    """
    chosen = choose_checkpoint(Path(checkpoint_dir), check_resumable, RESUMING, warn)
    return None if chosen is None else chosen[0]


def checkpoint_in_run(run_dir: Path) -> Path:
    """The checkpoint (file or sharded folder) to resume `run_dir` from: its newest resumable one."""
    path = choose_resume_checkpoint(
        RunDir(run_dir).checkpoints, warn=lambda line: print(line, file=sys.stderr)
    )
    if path is None:
        raise UserError(
            f"--ckpt_path: {run_dir} has no checkpoint to resume; start it afresh without --ckpt_path"
        )
    return path


def expand_run_dir_resume(args: list[str]) -> tuple[list[str], bool]:
    """Rewrite `fit ... --ckpt_path <run dir> ...` so the run's config.yaml comes first and the checkpoint
    replaces the directory. Returns (args, True) when it did so, else (args unchanged, False)."""
    if "fit" not in args:
        return args, False
    position, run_dir = _ckpt_path_argument(args)
    # A sharded (FSDP) checkpoint is a directory too; a run directory is one that holds checkpoints/.
    if run_dir is None or not RunDir(run_dir).holds_checkpoints():
        return args, False
    config = RunDir(run_dir).config
    if not config.is_file():
        raise UserError(
            f"--ckpt_path: {run_dir} is a directory without {config.name}; pass a run directory or a .ckpt file"
        )
    rest = args[: position[0]] + args[position[1] :]
    fit = rest.index("fit")
    # The saved config already names the run directory in trainer.default_root_dir; `run_name` keeps the
    # CLI from nesting a second run folder (named after config.yaml) inside it.
    resumed = ["--config", str(config), "--trainer.default_root_dir", str(run_dir.parent)]
    resumed += ["--run_name", run_dir.name]
    ckpt = [CKPT_FLAG, str(checkpoint_in_run(run_dir))]
    return [*rest[: fit + 1], *resumed, *rest[fit + 1 :], *ckpt], True


def _ckpt_path_argument(args: list[str]) -> tuple[tuple[int, int], Path | None]:
    """((start, end) of the --ckpt_path tokens, its value as a Path), or ((0, 0), None) when absent."""
    for index, arg in enumerate(args):
        if arg == CKPT_FLAG and index + 1 < len(args):
            return (index, index + 2), Path(args[index + 1])
        if arg.startswith(CKPT_FLAG + "="):
            return (index, index + 1), Path(arg.split("=", 1)[1])
    return (0, 0), None
