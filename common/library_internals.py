"""Every private part of Lightning, jsonargparse and wandb the project touches, fenced here: any release may
rename one, so each is reached through a function of this module alone, and `untested_versions` names an
installed library outside the range pyproject.toml declares (the versions CI ran these against). No library is
imported at module level: the callers hand in Lightning's objects."""

from __future__ import annotations

import contextlib
import json
import struct
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

FENCED = ("lightning", "jsonargparse", "wandb")  # the libraries whose private names are used below


def untested_versions(installed=metadata.version) -> list[str]:
    """'name version (tested: range)' for each fenced library installed outside our declared range; [] when
    all are inside or this project is not installed (its ranges unknown)."""
    from packaging.requirements import Requirement  # a dependency of Lightning's

    try:
        declared = [Requirement(line) for line in metadata.requires("gqa-gpt") or []]
    except metadata.PackageNotFoundError:
        return []
    outside = []
    for req in declared:
        if req.name in FENCED and req.marker is None:
            with contextlib.suppress(metadata.PackageNotFoundError):
                version = installed(req.name)
                if not req.specifier.contains(version, prereleases=True):
                    outside.append(f"{req.name} {version} (tested: {req.specifier})")
    return outside


def warn_untested_versions() -> None:
    """One warning naming the fenced libraries outside the tested range: what follows may then break."""
    outside = untested_versions()
    if outside:
        warnings.warn(
            f"{', '.join(outside)}: gqa-gpt reaches private parts of these libraries (common/library_internals.py)"
            " that were tested only inside those ranges; install a tested version if training misbehaves",
            stacklevel=2,
        )


# Lightning


def set_stop_requested(trainer, requested: bool) -> None:
    """Lightning's SIGTERM flag, checked once per step after the optimizer step: set, the run stops cleanly."""
    trainer._signal_connector.received_sigterm = requested


def align_logged_step(trainer) -> None:
    """Lightning's logger gate counts optimizer steps itself, one too high after a resume from a stop save: set it
    to the trainer's step."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step


def metrics_to_log(trainer) -> dict:
    """The values `self.log` gave Lightning that its loggers receive at this step."""
    return trainer._logger_connector.metrics["log"]


def validate_now(trainer) -> None:
    """Run the validation loop at once, as a fresh validation of the current step, and return to training."""
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    val_loop.restarting = False
    trainer.validating = True
    first_loop_iter = trainer._logger_connector._first_loop_iter
    val_loop.run()
    trainer.training = True
    trainer._logger_connector._first_loop_iter = first_loop_iter


def replace_due_validation(trainer, run) -> None:
    """Call `run` instead of the validation Lightning's restarted loop runs when a resumed step was due one."""
    trainer.fit_loop.epoch_loop.val_loop.increment_progress_to_evaluation_end = run


def restore_due_validation(trainer) -> None:
    """Undo `replace_due_validation`."""
    vars(trainer.fit_loop.epoch_loop.val_loop).pop("increment_progress_to_evaluation_end", None)


# jsonargparse


def parse_without_links(parser, args: list[str]):
    """jsonargparse's parse of `args` with no defaults and no linked arguments (a link fails on a missing default,
    data.vocab_size -> model.vocab_size); None when this jsonargparse cannot skip links."""
    try:
        from jsonargparse._link_arguments import skip_apply_links
    except ImportError:
        return None
    with skip_apply_links():
        return parser.parse_args(args, defaults=False)


# wandb

_BLOCK, _HEADER = 32768, 7
_FULL, _LAST = 1, 4  # record types that end an assembled record


def wandb_records(wandb_file: Path) -> Iterator[tuple[str, dict]]:
    """("history", {key: value}) for each history row of one `.wandb` file and ("summary", {key: value}) for each
    summary update, in the order written: a LevelDB-style log of 32 KiB blocks of records with 7-byte headers,
    holding wandb's internal protobuf `Record`s."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = wandb_file.read_bytes()
    pos, payload = _HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # too little room for a header: the rest of the block is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        payload += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind not in (_FULL, _LAST) or pos > len(data):
            continue
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:  # a killed writer's torn last block: nothing after it was written whole
            return
        payload = b""
        kind_of_record = record.WhichOneof("record_type")
        if kind_of_record in ("history", "summary"):
            items = record.history.item if kind_of_record == "history" else record.summary.update
            yield (
                kind_of_record,
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items},
            )
