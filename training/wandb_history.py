"""What a run's wandb segments hold: the history rows, read back from their `.wandb` files.

A resume re-logs the train/* and val/* points a killed segment never wrote (wandb writes its file in blocks, so a
kill -9 loses the last ones); this says which points the files already hold, so none is logged twice. The file is a
LevelDB-style log: 32 KiB blocks of records with a 7-byte header (crc32, length, type) holding protobuf
`Record`s, after a 7-byte W&B header; a killed writer leaves a partial record at the end, which is skipped.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

from checkpoints.run_dir import RunDir

_BLOCK, _HEADER = 32768, 7
_FULL, _LAST = 1, 4  # record types that end an assembled record


def segment_files(run_dir: Path) -> list[Path]:
    """The `.wandb` file of each segment under the run's wandb/ folder (offline and online), oldest first."""
    return sorted(RunDir(run_dir).wandb.glob("*run-*/run-*.wandb"))


def history_rows(wandb_file: Path) -> Iterator[dict]:
    """The history rows of one `.wandb` file, {key: value}, in the order written."""
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
        if record.WhichOneof("record_type") == "history":
            yield {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }


def held_rows(run_dir: Path, prefixes: tuple[str, ...]) -> set[tuple[int, str]]:
    """(`trainer/global_step`, prefix) for each row a segment of the run holds with a key of one of `prefixes`."""
    return {
        (row["trainer/global_step"], prefix)
        for path in segment_files(run_dir)
        for row in history_rows(path)
        if "trainer/global_step" in row
        for prefix in prefixes
        if any(key.startswith(prefix) for key in row)
    }
