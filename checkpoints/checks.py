"""Checks on `--ckpt_path` that run right after parsing, before any file or wandb run is touched.

A text file, a truncated file or another project's checkpoint is one line (checkpoints.format's CheckpointError);
so is a config whose model sizes do not fit the checkpoint's weights (`--model.n_layer 6` on a 2-layer run,
`validate` with the config of another run), which would otherwise fail later with a 50-line traceback, after
config.yaml was rewritten and an empty wandb segment created.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from common.errors import UserError
from model import GPT, ModelConfig

from .format import META_KEY, read_checkpoint
from .run_dir import RunDir

# Values of --ckpt_path that Lightning resolves itself (or that checkpoints.settings resolves later).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
MODEL_FIELDS = tuple(field.name for field in dataclasses.fields(ModelConfig))
# Model fields that the data module owns (see training/cli.py's link_arguments).
DATA_FIELDS = ("vocab_size", "block_size")


def is_checkpoint_file_path(ckpt_path: str | None) -> bool:
    """True for a --ckpt_path naming a local file or folder (not 'last', a URL, or nothing)."""
    return bool(ckpt_path) and ckpt_path not in SPECIAL_CKPT_PATHS and "://" not in ckpt_path


def check_readable(ckpt_path: str | None) -> None:
    """One line (CheckpointError, exit 2) unless `ckpt_path` is a readable checkpoint written by train.py."""
    if is_checkpoint_file_path(ckpt_path):
        read_checkpoint(ckpt_path)


def requested_model_config(config) -> dict:
    """The ModelConfig fields a parsed subcommand config asks for (model.* plus the data-owned sizes)."""
    model, data = config.get("model") or {}, config.get("data") or {}
    requested = {name: model.get(name) for name in MODEL_FIELDS if model.get(name) is not None}
    requested.update({name: data.get(name) for name in DATA_FIELDS if data.get(name) is not None})
    return requested


def refuse_size_change(config, ckpt_path: str | None, subcommand: str) -> None:
    """Raise UserError when the parsed config builds a model whose weights cannot load `ckpt_path`."""
    if not is_checkpoint_file_path(ckpt_path):
        return
    stored = read_checkpoint(ckpt_path)[0][META_KEY]["model_config"]
    requested = {**stored, **requested_model_config(config)}
    if _weight_shapes(stored) == _weight_shapes(requested):
        return
    changed = ", ".join(
        f"{name}={requested[name]!r} (checkpoint: {stored.get(name)!r})"
        for name in MODEL_FIELDS
        if requested.get(name) != stored.get(name)
    )
    if subcommand == "fit":
        fix = "a run's model sizes are fixed: drop the override, or start a new run with --run_name"
    else:
        fix = f"pass the config it was trained with (--config {_run_config(ckpt_path)})"
    raise UserError(f"--ckpt_path {ckpt_path}: the config asks {changed}; {fix}")


def _weight_shapes(fields: dict) -> dict[str, tuple[int, ...]]:
    # On the meta device: shapes only, no memory and no initialisation cost.
    with torch.device("meta"):
        model = GPT(ModelConfig(**{k: v for k, v in fields.items() if k in MODEL_FIELDS}))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _run_config(ckpt_path: str) -> str:
    """The config.yaml of the run a checkpoint belongs to (runs/<run>/checkpoints/x.ckpt), or a placeholder."""
    for run in (RunDir(ckpt_path), RunDir.of_checkpoint(ckpt_path)):
        if run.config.is_file():
            return str(run.config)
    return str(RunDir(Path("runs") / "<run>").config)
