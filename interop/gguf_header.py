"""A GGUF file's header read in one pass: its metadata as plain Python values, and each tensor's bytes as a numpy
view of the memory-mapped file (nothing is copied or read before it is asked for).

The `gguf` package's reader builds numpy views of every part of every field, one per array element: for
SmolLM2's 49 k-token vocabulary and 49 k merges that is 147 k calls and 2 s of a 3 s load. This reads the same
bytes with `struct`, a loop per string array and numpy for numeric arrays. The layout is llama.cpp's (GGUF
versions 2 and 3, little-endian): magic, version, tensor count, metadata count, the key-value pairs, the tensor
infos, then the tensors' data at the file's alignment.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9  # value types with a length before their contents
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# Tensor types read as numbers; every other type is raw bytes, (rows, bytes per row), for its reader.
NUMERIC = {0: np.float32, 1: np.float16}


class HeaderTensor(NamedTuple):
    """One tensor: its name, dimensions in GGUF order (fastest-varying first), ggml type id and data."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    data: np.ndarray


class Header:
    """The metadata (`fields`: key -> value) and tensors (`tensors`: name -> HeaderTensor) of a GGUF file.

    `block_bytes(type_id)` gives (values per block, bytes per block) of each tensor type; a damaged file raises
    ValueError, struct.error or UnicodeDecodeError.
    """

    def __init__(self, path: Path, block_bytes) -> None:
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if self._map[:4] != MAGIC:
            raise ValueError("not a GGUF file (its first four bytes are not 'GGUF')")
        self._offset = 4
        version, n_tensors, n_fields = self._read("<IQQ")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reader knows 2 and 3)")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._read("<I")[0])
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._read("<I")
            shape = self._read(f"<{n_dims}Q")
            type_id, offset = self._read("<IQ")
            infos.append((name, shape, type_id, offset))
        alignment = self.fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment!r} is not a power of two")
        start = -(-self._offset // alignment) * alignment
        self.tensors = {
            name: HeaderTensor(name, shape, type_id, self._data(start + offset, shape, type_id, block_bytes))
            for name, shape, type_id, offset in infos
        }
        if len(self.tensors) != len(infos):
            raise ValueError("two tensors share a name")

    def release(self) -> None:
        """Drop the file's pages read so far from this process's memory: they stay in the system's page cache, and
        reading them again faults them back in. A load calls it after each matrix, so its peak holds about one
        matrix of the file, not all of it (the mapping's pages count in the resident size)."""
        if hasattr(mmap, "MADV_DONTNEED"):  # not on every platform
            self._map.madvise(mmap.MADV_DONTNEED)

    def _read(self, layout: str) -> tuple:
        values = struct.unpack_from(layout, self._map, self._offset)
        self._offset += struct.calcsize(layout)
        return values

    def _string(self) -> str:
        (length,) = self._read("<Q")
        end = self._offset + length
        if end > len(self._map):
            raise ValueError("a string runs past the end of the file")
        text = self._map[self._offset : end].decode("utf-8")
        self._offset = end
        return text

    def _value(self, kind: int) -> Any:
        if kind == STRING:
            return self._string()
        if kind in SCALARS:
            return self._read("<" + SCALARS[kind])[0]
        if kind != ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self._read("<IQ")
        if item in SCALARS:  # numbers in bulk
            values = np.frombuffer(self._map, np.dtype("<" + SCALARS[item]), count, self._offset)
            self._offset += values.nbytes
            return values.tolist()
        if item == STRING:  # a vocabulary or its merges: ~100k strings, so one tight loop
            return self._strings(count)
        return [self._value(item) for _ in range(count)]

    def _strings(self, count: int) -> list[str]:
        data, offset, end = self._map, self._offset, len(self._map)
        length_at = struct.Struct("<Q").unpack_from
        strings = []
        for _ in range(count):
            (length,) = length_at(data, offset)
            offset += 8
            if offset + length > end:
                raise ValueError("a string runs past the end of the file")
            strings.append(data[offset : offset + length].decode("utf-8"))
            offset += length
        self._offset = offset
        return strings

    def _data(self, start: int, shape: tuple[int, ...], type_id: int, block_bytes) -> np.ndarray:
        rows = tuple(reversed(shape))  # numpy order: slowest-varying first
        if type_id in NUMERIC:
            dtype = np.dtype(NUMERIC[type_id]).newbyteorder("<")
            return np.frombuffer(self._map, dtype, int(np.prod(rows)), start).reshape(rows)
        per_block, size = block_bytes(type_id)
        if rows[-1] % per_block:
            raise ValueError(f"a row of {rows[-1]} values is not whole blocks of {per_block}")
        row_bytes = rows[-1] // per_block * size
        count = int(np.prod(rows[:-1])) * row_bytes
        return np.frombuffer(self._map, np.uint8, count, start).reshape(*rows[:-1], row_bytes)
