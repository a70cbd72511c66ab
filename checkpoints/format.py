"""The checkpoint format: a Lightning checkpoint dict with the GPT weights under STATE_PREFIX and plain-typed
metadata under META_KEY, so `torch.load(path, weights_only=True)` reads it without Lightning; a sharded strategy
(FSDP2) writes a folder of torch.distributed.checkpoint shards plus SHARDED_META, read here in one process.
"""

from __future__ import annotations

import hashlib
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import first_line, to_stderr
from model.config import ModelConfig
from model.gpt import GPT
from model.lora import adapter_state

from .run_dir import (
    LAST_NAME,
    SHARDED_INDEX,
    SHARDED_META,
    CheckpointError,
    RunDir,
    Wording,
    checkpoint_dict_file,
    choose_checkpoint,
    is_sharded_checkpoint,
)

FORMAT_VERSION = 1
META_KEY = "gqa_gpt"
STATE_PREFIX = "model."
REQUIRED_KEYS = ("format", "model_config", "tokenizer_json", "tokenizer_sha256")
# In META_KEY of a checkpoint of adapters: their rank, alpha, dropout and targets, and the base they were trained
# on ({"name", "revision", "sha256"}, the sha256 of its weight files); its state_dict holds the adapters only.
LORA_KEY = "lora"
INTERRUPTED = "its save was interrupted; use an earlier checkpoint"
READING = Wording(
    bad="cannot be read",
    using="using",
    none="{newest}: {reason} (no checkpoint in {folder} can be read: {count} checked)",
)


@dataclass
class LoadedCheckpoint:
    model: GPT
    tokenizer_json: str
    meta: dict
    path: Path


def checkpoint_metadata(
    config: ModelConfig, tokenizer_json: str, tokenizer_sha256: str, data: dict, skipped_batches: int = 0
) -> dict:
    """The META_KEY entry of a checkpoint: model config, embedded tokenizer and data settings as plain types."""
    return {
        "format": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "tokenizer_json": tokenizer_json,
        "tokenizer_sha256": tokenizer_sha256,
        "data": plain(data),
        "skipped_batches": skipped_batches,
    }


def plain(value: Any) -> Any:
    """`value` reduced to str/int/float/bool/None/list/dict, so weights_only loading accepts it."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def read_checkpoint(path: str | Path) -> tuple[dict, Path]:
    """The checked checkpoint dict and its path (for a run directory, its newest readable checkpoint)."""
    path = Path(path).expanduser()
    if path.is_dir() and not is_sharded_checkpoint(path) and not (path / SHARDED_INDEX).is_file():
        run = RunDir(path)
        folder = run.checkpoints if run.holds_checkpoints() else path  # a run directory, or its checkpoints/
        chosen = choose_checkpoint(folder, read_checkpoint_file, READING, warn=to_stderr)
        if chosen is not None:
            return chosen[1], chosen[0]
        if not (folder / LAST_NAME).exists():
            raise CheckpointError(
                f"{path}: no checkpoints in this directory; pass a .ckpt file, a run directory or a "
                "sharded checkpoint folder"
            )
        path = folder / LAST_NAME  # not a checkpoint at all (a sharded save cut short): say why, below
    if path.is_dir() and not is_sharded_checkpoint(path):
        raise CheckpointError(f"{path}: sharded checkpoint folder without {SHARDED_META}: {INTERRUPTED}")
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found; pass a .ckpt file or a run directory")
    return read_checkpoint_file(path), path


def read_checkpoint_file(path: Path) -> dict:
    """The dict of one checkpoint file or sharded folder, its checksums, metadata and shard files checked."""
    file = checkpoint_dict_file(path)
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated zips and pickles
        raise _unreadable(file, err) from err
    _check_checksums(file)
    if (
        not isinstance(ckpt, dict)
        or META_KEY not in ckpt
        or ("state_dict" not in ckpt and not is_sharded_checkpoint(path))
    ):
        raise CheckpointError(
            f"{path}: not a gqa-gpt checkpoint (no '{META_KEY}' metadata); use one written by train.py"
        )
    check_metadata(ckpt[META_KEY], path)
    if is_sharded_checkpoint(path):
        sharded_contents(path)
    return ckpt


# What torch.save writes first: a zip archive, or (the legacy format) a pickle's protocol opcode.
_SAVED_MAGIC = (b"PK\x03\x04", b"\x80")


def _unreadable(file: Path, err: Exception) -> CheckpointError:
    """A damaged checkpoint, or a file that never was one (config.yaml, tokenizer.json): each with its fix."""
    if isinstance(err, OSError):  # unreadable (permissions, I/O), not damaged
        return CheckpointError(
            f"{file}: cannot read it ({err.strerror or err}); check the file's permissions"
        )
    with open(file, "rb") as f:
        head = f.read(4)
        if not head or head.startswith(_SAVED_MAGIC):  # an empty file is a save cut short too
            return CheckpointError(
                f"{file}: cannot read checkpoint ({type(err).__name__}); the file is truncated or corrupt"
            )
    # A folder with checkpoints/ holding .ckpt files: the repository's own checkpoints/ package is no run.
    runs = (RunDir(p) for p in (file.parent, file.parent.parent))
    run = next((r for r in runs if r.holds_checkpoints() and any(r.checkpoints.glob("*.ckpt"))), None)
    fix = f"pass the run directory {run.path}" if run else "pass a .ckpt file or a run directory"
    return CheckpointError(f"{file}: not a checkpoint (torch.save did not write it); {fix}")


def _check_checksums(file: Path) -> None:
    """Refuse zip members that fail their CRC-32: torch.load does not check, so flipped bytes would load silently."""
    if not zipfile.is_zipfile(file):  # the legacy pickle format (just read by torch.load): no checksums
        return
    try:
        with zipfile.ZipFile(file) as archive:
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        raise _unreadable(file, err) from err
    if bad_member is not None:
        raise CheckpointError(
            f"{file}: checksum mismatch in {bad_member}; the file is corrupt: use an earlier checkpoint"
        )


def check_metadata(meta: dict, path: Path) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: checkpoint metadata lacks {missing[0]!r}; the checkpoint was altered")
    if meta["format"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {meta['format']} is newer than this code's {FORMAT_VERSION}; update gqa-gpt"
        )
    if hashlib.sha256(meta["tokenizer_json"].encode("utf-8")).hexdigest() != meta["tokenizer_sha256"]:
        raise CheckpointError(
            f"{path}: embedded tokenizer does not match its sha256; the checkpoint was altered"
        )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Rebuild the GPT of a training checkpoint file or run directory."""
    ckpt, path = read_checkpoint(path)
    return loaded_from(ckpt, path, map_location)


def loaded_from(ckpt: dict, path: Path, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    meta = ckpt[META_KEY]
    model = GPT(ModelConfig(**meta["model_config"]))
    state = read_sharded_weights(path, model) if is_sharded_checkpoint(path) else ckpt["state_dict"]
    state = {k.removeprefix(STATE_PREFIX): v for k, v in state.items() if k.startswith(STATE_PREFIX)}
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(
            f"{path}: weights do not fit the stored model config ({first_line(err)})"
        ) from err
    return LoadedCheckpoint(model.to(map_location).eval(), meta["tokenizer_json"], meta, path)


def check_lora_checkpoint(
    ckpt: dict, model: torch.nn.Module, base_sha256: str | None, where: object = ""
) -> None:
    """One line unless `ckpt` holds the adapters of `model` (a GPT with adapters added, on its base), trained on
    the base whose weight files have the sha256 `base_sha256`."""
    lora = ckpt[META_KEY].get(LORA_KEY)
    where = where or "the checkpoint"
    if lora is None:
        raise CheckpointError(
            f"{where} holds every weight, not adapters; resume it without model.lora_rank, or start a new run"
        )
    base = lora["base"]
    if base_sha256 is not None and base["sha256"] != base_sha256:
        raise CheckpointError(
            f"the adapters of {where} were trained on {base['name']} (weights sha256 {base['sha256'][:12]}), "
            f"but that name now holds other weights ({base_sha256[:12]}); use the base they were trained on"
        )
    expected = {STATE_PREFIX + name: tuple(t.shape) for name, t in adapter_state(model).items()}
    stored = {name: tuple(t.shape) for name, t in ckpt["state_dict"].items()}
    if stored != expected:
        differ = sorted(stored.keys() ^ expected.keys()) or [
            n for n in sorted(stored) if stored[n] != expected[n]
        ]
        raise CheckpointError(
            f"{where}: its adapters do not fit model.lora_rank and model.lora_targets ({differ[0]}); use the "
            f"values it was trained with (rank {lora['rank']}, targets {', '.join(lora['targets'])})"
        )


def sharded_contents(path: Path) -> set[str]:
    """The state groups ("state_dict", "optimizer_0", ...) a sharded folder's index names; its shards must be there."""
    from torch.distributed.checkpoint import FileSystemReader

    if not (path / SHARDED_INDEX).is_file():
        raise CheckpointError(f"{path}: sharded checkpoint without {SHARDED_INDEX}: {INTERRUPTED}")
    try:
        index = FileSystemReader(path).read_metadata()
    except Exception as err:
        raise CheckpointError(
            f"{path / SHARDED_INDEX}: unreadable ({type(err).__name__}): {INTERRUPTED}"
        ) from err
    files = {item.relative_path for item in index.storage_data.values()}
    missing = sorted(name for name in files if not (path / name).is_file())
    if missing:
        raise CheckpointError(f"{path}: shard file {missing[0]} is missing: {INTERRUPTED}")
    return {key.split(".", 1)[0] for key in index.state_dict_metadata}


def read_sharded_weights(path: Path, model: GPT) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    if "state_dict" not in sharded_contents(path):
        raise CheckpointError(
            f"{path}: this sharded checkpoint holds no model weights; use one written by train.py"
        )
    # dcp fills tensors of the expected shapes: the model's state dict, keyed as Lightning saved it, is the template.
    state = {STATE_PREFIX + name: tensor for name, tensor in model.state_dict().items()}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load({"state_dict": state}, checkpoint_id=path, no_dist=True)
    except (Exception, dcp.api.CheckpointException) as err:  # missing keys, shapes that differ
        # CheckpointException (a BaseException) wraps each rank's own error: that one says what went wrong.
        cause = next(iter(err.failures.values()))[0] if isinstance(err, dcp.api.CheckpointException) else err
        if isinstance(cause, KeyboardInterrupt):
            raise cause from None
        raise CheckpointError(
            f"{path}: cannot read the sharded weights ({type(cause).__name__}: {first_line(cause)}); "
            "the folder is incomplete or altered"
        ) from err
    return state
