"""Resuming: `--ckpt_path` read once and checked, which checkpoint can continue a run, `--ckpt_path runs/<run>`
(its config.yaml read first, so no override of the first run is repeated). The checks run before any file or
wandb run is touched: a bad checkpoint is one line, not a traceback after config.yaml was rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from common.errors import UserError, to_stderr
from model import GPT, ModelConfig

from .format import LORA_KEY, META_KEY, loaded_from, read_checkpoint, sharded_contents
from .run_dir import CheckpointError, RunDir, Wording, choose_checkpoint, is_sharded_checkpoint

CKPT_FLAG = "--ckpt_path"
# What Lightning needs to continue a run exactly; a checkpoint without them is not resumable.
RESUME_KEYS = ("global_step", "state_dict", "optimizer_states", "loops")
RESUMING = Wording(
    bad="cannot be resumed",
    using="resuming from",
    none="no checkpoint in {folder} can resume training (newest {name}: {reason}; {count} checked); pass a "
    "good file with --ckpt_path or start a new run with --run_name",
)
# Values of --ckpt_path that Lightning resolves itself (or that checkpoints.settings resolves later).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
MODEL_FIELDS = tuple(field.name for field in dataclasses.fields(ModelConfig))
# Model fields that the data module owns (see training/cli.py's link_arguments).
DATA_FIELDS = ("vocab_size", "block_size")


def check_resumable(path: Path) -> dict:
    """The checkpoint dict of `path`; CheckpointError unless it is intact, ours, and holds what resuming needs."""
    ckpt, _ = read_checkpoint(path)
    sharded = is_sharded_checkpoint(path)
    held = sharded_contents(path) if sharded else set()  # the groups in its shards: weights, optimizer states
    needed = ("global_step", "loops", "state_dict", "optimizer_0") if sharded else RESUME_KEYS
    missing = [key for key in needed if key not in ckpt and key not in held]
    if missing:
        raise CheckpointError(f"{path}: lacks {', '.join(missing)}; it cannot resume training")
    if (
        not sharded and LORA_KEY not in ckpt[META_KEY]
    ):  # weights that fit the config (adapters: at their load)
        loaded_from(ckpt, path)
    return ckpt


def choose_resume_checkpoint(checkpoint_dir: Path, warn: Callable[[str], None] = to_stderr) -> Path | None:
    """The newest resumable checkpoint in `checkpoint_dir` (None: no checkpoint at all), as `choose_checkpoint`."""
    chosen = choose_checkpoint(Path(checkpoint_dir), check_resumable, RESUMING, warn)
    return None if chosen is None else chosen[0]


def checkpoint_in_run(run_dir: Path) -> Path:
    path = choose_resume_checkpoint(RunDir(run_dir).checkpoints, warn=to_stderr)
    if path is None:
        raise UserError(
            f"--ckpt_path: {run_dir} has no checkpoint to resume; start it afresh without --ckpt_path"
        )
    return path


def expand_run_dir_resume(args: list[str]) -> tuple[list[str], bool]:
    """Rewrite `fit|validate ... --ckpt_path <run dir>`: the run's config.yaml first, its checkpoint for the
    directory (for fit the newest resumable one, for validate the newest readable one)."""
    subcommand = next((arg for arg in args if arg in ("fit", "validate")), None)
    if subcommand is None:
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
    at = rest.index(subcommand)
    # `run_name` keeps the CLI from nesting a second run folder (named after config.yaml) inside the run.
    resumed = ["--config", str(config), "--trainer.default_root_dir", str(run_dir.parent)]
    resumed += ["--run_name", run_dir.name]
    # validate needs weights only: a checkpoint saved without optimizer states still validates.
    chosen = checkpoint_in_run(run_dir) if subcommand == "fit" else read_checkpoint(run_dir)[1]
    return [*rest[: at + 1], *resumed, *rest[at + 1 :], CKPT_FLAG, str(chosen)], True


def _ckpt_path_argument(args: list[str]) -> tuple[tuple[int, int], Path | None]:
    """((start, end) of the --ckpt_path tokens, its value as a Path), or ((0, 0), None) when absent."""
    for index, arg in enumerate(args):
        if arg == CKPT_FLAG and index + 1 < len(args):
            return (index, index + 2), Path(args[index + 1])
        if arg.startswith(CKPT_FLAG + "="):
            return (index, index + 1), Path(arg.split("=", 1)[1])
    return (0, 0), None


def read_resume_point(ckpt_path: str | None) -> dict | None:
    """The checkpoint dict a local --ckpt_path names (None for none, 'last' or a URL), read once for every check."""
    if not ckpt_path or ckpt_path in SPECIAL_CKPT_PATHS or "://" in ckpt_path:
        return None
    return read_checkpoint(ckpt_path)[0]


def check_resume_point(config, ckpt_path: str, ckpt: dict, subcommand: str) -> str | None:
    """Refuse a config whose model cannot load `ckpt`; for a fit of a run `ckpt` already finished, the line that
    says so (the fit then only logs what a kill after that checkpoint lost)."""
    stored = ckpt[META_KEY]["model_config"]
    model, data = config.get("model") or {}, config.get("data") or {}
    requested = {**stored, **{name: model.get(name) for name in MODEL_FIELDS if model.get(name) is not None}}
    requested.update({name: data.get(name) for name in DATA_FIELDS if data.get(name) is not None})
    adapters = ckpt[META_KEY].get(LORA_KEY)
    if subcommand == "fit" and bool(adapters) != bool(model.get("lora_rank")):
        held = f"adapters of rank {adapters['rank']}" if adapters else "every weight"
        asked = (
            f"lora_rank={model.get('lora_rank')}" if model.get("lora_rank") else "no adapters (lora_rank 0)"
        )
        raise UserError(
            f"--ckpt_path {ckpt_path}: it holds {held}, the config asks {asked}; resume with the model.lora_rank "
            "it was trained with, or start a new run with --run_name"
        )
    changed = []
    if _weight_shapes(stored) != _weight_shapes(requested):
        changed = [
            f"{name}={requested[name]!r} (checkpoint: {stored.get(name)!r})"
            for name in MODEL_FIELDS
            if requested.get(name) != stored.get(name)
        ]
    # The training window leaves the weights' shapes alone, but a resume is exact: the same batches as one
    # uninterrupted run. The data settings hold the window (with init_from, model.block_size is the context).
    window = (ckpt[META_KEY].get("data") or {}).get("block_size")
    asked = data.get("block_size")
    if subcommand == "fit" and None not in (window, asked) and asked != window:
        if not any(entry.startswith("block_size=") for entry in changed):  # said once
            changed.append(f"data.block_size={asked!r} (checkpoint: {window!r})")
    if changed:
        if subcommand == "fit":
            fix = "a run's model sizes and data.block_size are fixed: drop the override, or start a new run "
            fix += "with --run_name"
        else:
            fix = f"pass the config it was trained with (--config {_run_config(ckpt_path)})"
        raise UserError(f"--ckpt_path {ckpt_path}: the config asks {', '.join(changed)}; {fix}")
    step, max_steps = ckpt.get("global_step"), config.trainer.max_steps
    if subcommand == "fit" and step is not None and max_steps is not None and 0 <= max_steps <= step:
        return (
            f"{ckpt_path} is at step {step}, already trainer.max_steps={max_steps}: nothing to train "
            "(raise --trainer.max_steps to train further)"
        )
    return None


def _weight_shapes(fields: dict) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):  # shapes only: no memory and no initialisation cost
        model = GPT(ModelConfig(**{k: v for k, v in fields.items() if k in MODEL_FIELDS}))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _run_config(ckpt_path: str) -> str:
    for run in (RunDir(ckpt_path), RunDir.of_checkpoint(ckpt_path)):
        if run.config.is_file():
            return str(run.config)
    return str(RunDir(Path("runs") / "<run>").config)


def refuse_to_overwrite(run_dir: Path) -> None:
    if any(RunDir(run_dir).checkpoints.glob("*.ckpt")):
        raise UserError(
            f"{run_dir} already holds checkpoints; resume it with `python train.py fit --ckpt_path {run_dir}` "
            "or start a new run with --run_name"
        )
