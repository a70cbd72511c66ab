"""`python train.py fit --ckpt_path runs/<run>`: resume a run from its directory, with the config it saved.

A run directory holds `config.yaml` (the fully resolved config, written by LightningCLI at the start of the
run) and `checkpoints/`. Resuming from the directory reads that config first, so no override given to the
first run (data.data_files, model sizes, ...) has to be repeated; anything else on the command line is
applied on top of it, as usual.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from common.errors import UserError
from model.checkpoint import checkpoint_dict_file

CONFIG_NAME = "config.yaml"
CKPT_FLAG = "--ckpt_path"


def checkpoint_in_run(run_dir: Path) -> Path:
    """The checkpoint (file or sharded folder) to resume `run_dir` from: its newest whole one (training.resume_choice)."""
    from .resume_choice import choose_resume_checkpoint

    path = choose_resume_checkpoint(run_dir / "checkpoints", warn=lambda line: print(line, file=sys.stderr))
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
    if run_dir is None or not (run_dir / "checkpoints").is_dir():
        return args, False
    config = run_dir / CONFIG_NAME
    if not config.is_file():
        raise UserError(
            f"--ckpt_path: {run_dir} is a directory without {CONFIG_NAME}; pass a run directory or a .ckpt file"
        )
    rest = args[: position[0]] + args[position[1] :]
    fit = rest.index("fit")
    # The saved config already names the run directory in trainer.default_root_dir; `run_name` keeps the
    # CLI from nesting a second run folder (named after config.yaml) inside it.
    resumed = [
        "--config",
        str(config),
        "--trainer.default_root_dir",
        str(run_dir.parent),
        "--run_name",
        run_dir.name,
    ]
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


def checkpoint_step(path: Path) -> int | None:
    """The global step a checkpoint file or sharded folder holds, read without loading its tensors into memory."""
    try:
        file = checkpoint_dict_file(path)
        return int(torch.load(file, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # an unreadable checkpoint is reported by the real load, with its own message
        return None
