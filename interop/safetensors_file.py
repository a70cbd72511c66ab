"""A Hugging Face folder's safetensors files (one, or the shards its index lists), each read through a memory map,
one tensor at a time: `copy(name)` gives the tensor in memory of
its own and drops the file's pages read so far, so a load's peak is about the model's own bytes plus one tensor,
not the file and the model side by side.

The layout: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}} (and an
optional "__metadata__"), then the tensors' bytes, offsets counted from the header's end.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

import torch

from common.errors import first_line

from .model_files import read_json_object
from .source import PretrainedError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}  # fmt: skip


class SafetensorsFile:
    """The tensors of one file: `shapes` (name -> shape) from the header, `copy(name)` for each one's values. A
    damaged or foreign file raises ValueError (or struct.error) naming what is wrong."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as file:
            # Copy-on-write, so torch gets a writable buffer; nothing is ever written to it.
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        (length,) = struct.unpack_from("<Q", self._map)
        if 8 + length > len(self._map):
            raise ValueError(f"its header claims {length} bytes; the file has {len(self._map)}")
        header = json.loads(self._map[8 : 8 + length])
        header.pop("__metadata__", None)
        self._start, self._infos = 8 + length, header
        self.shapes = {name: tuple(info["shape"]) for name, info in header.items()}
        for name, info in header.items():
            begin, end = info["data_offsets"]
            if info["dtype"] not in DTYPES:
                raise ValueError(f"tensor {name} has dtype {info['dtype']}, not one of {', '.join(DTYPES)}")
            size = math.prod(info["shape"]) * DTYPES[info["dtype"]].itemsize
            if end - begin != size or self._start + end > len(self._map):
                raise ValueError(f"tensor {name}'s bytes ({begin}..{end}) do not fit its shape or the file")

    def copy(self, name: str) -> torch.Tensor:
        """Tensor `name` in memory of its own; the file's pages read for it leave this process's memory (they stay
        in the system's page cache)."""
        info = self._infos[name]
        dtype, shape = DTYPES[info["dtype"]], info["shape"]
        count = math.prod(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        view = torch.frombuffer(
            self._map, dtype=dtype, count=count, offset=self._start + info["data_offsets"][0]
        )
        tensor = view.view(shape).clone()
        del view
        if hasattr(mmap, "MADV_DONTNEED"):  # not on every platform
            self._map.madvise(mmap.MADV_DONTNEED)
        return tensor


def hf_weight_files(directory: Path) -> dict[str, SafetensorsFile]:
    """The file holding each tensor: model.safetensors, or the shards listed in model.safetensors.index.json."""
    index_path = directory / WEIGHTS_INDEX_NAME
    if index_path.is_file():
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise PretrainedError(
                f"{index_path}: weight_map is not an object of file names; restore the file"
            )
        shards = sorted(set(weight_map.values()))
    elif (directory / WEIGHTS_NAME).is_file():
        shards = [WEIGHTS_NAME]
    else:
        raise PretrainedError(
            f"{directory}: no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; save the weights as safetensors"
        )
    files: dict[str, SafetensorsFile] = {}
    for shard in shards:
        try:
            file = SafetensorsFile(directory / shard)
        except (OSError, ValueError, struct.error, KeyError, TypeError) as err:
            raise PretrainedError(
                f"{directory / shard}: cannot read it ({first_line(err)}); the file is missing or damaged"
            ) from err
        files |= dict.fromkeys(file.shapes, file)
    return files
