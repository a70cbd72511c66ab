"""Reading the self-contained checkpoints that training writes, without Lightning.

A checkpoint is a Lightning checkpoint dict whose `state_dict` holds the GPT weights under the prefix
`model.` and whose `gqa_gpt` entry holds plain-typed metadata:
`{"format": 1, "model_config": dict, "tokenizer_json": str, "tokenizer_sha256": str, "data": dict}`.
Everything is plain types and tensors, so `torch.load(path, weights_only=True)` reads it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .gpt import GPT

META_KEY = "gqa_gpt"
STATE_PREFIX = "model."


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated or not one of ours; the message is one line."""


@dataclass
class LoadedCheckpoint:
    model: GPT
    tokenizer_json: str
    meta: dict
    path: Path


def resolve_checkpoint(path: str | Path) -> Path:
    """The file behind `path`: a .ckpt file, or a run directory whose checkpoints/last.ckpt is used."""
    path = Path(path).expanduser()
    if path.is_dir():
        for candidate in (path / "checkpoints" / "last.ckpt", path / "last.ckpt"):
            if candidate.is_file():
                return candidate
        raise CheckpointError(f"{path}: no checkpoints/last.ckpt in this directory; pass a .ckpt file or a run directory")
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; pass a .ckpt file or a run directory")
    return path


def read_checkpoint(path: str | Path) -> tuple[dict, Path]:
    """The raw checkpoint dict (weights_only) and its resolved path, with one-line errors."""
    path = resolve_checkpoint(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated zips and pickles
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(err).__name__}); the file is truncated or corrupt") from err
    if not isinstance(ckpt, dict) or META_KEY not in ckpt or "state_dict" not in ckpt:
        raise CheckpointError(f"{path}: not a gqa-gpt checkpoint (no '{META_KEY}' metadata); use one written by train.py")
    return ckpt, path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Rebuild the GPT of a training checkpoint and check the embedded tokenizer's sha256."""
    ckpt, path = read_checkpoint(path)
    meta = ckpt[META_KEY]
    tokenizer_json = meta["tokenizer_json"]
    if hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest() != meta["tokenizer_sha256"]:
        raise CheckpointError(f"{path}: embedded tokenizer does not match its sha256; the checkpoint was altered")
    model = GPT(ModelConfig(**meta["model_config"]))
    state = {k[len(STATE_PREFIX) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(STATE_PREFIX)}
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise CheckpointError(f"{path}: weights do not fit the stored model config ({first})") from err
    return LoadedCheckpoint(model.to(map_location).eval(), tokenizer_json, meta, path)
