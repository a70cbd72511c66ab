"""The on-disk token cache: one folder of flat token part files, tokenizer.json and meta.json.

`meta.json` lists the train and validation part files in order and records what training needs to report bits
per byte. It is written last and the folder only gets its final name once complete, so a crashed run never
leaves a folder a later run would trust. The streaming folder holds just val.bin next to its tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.files import StagedFolder
from data.tokenizer import Tokenizer

TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 2  # 2: part files listed in meta.json
_STATS_CHUNK = 1 << 24


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab <= 65536): half the disk and page cache of uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class TokenWriter:
    """Appends token ids to a flat binary file in the cache dtype; `count` is the number written so far."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path = path
        self.dtype = dtype
        self.count = 0
        self._file = path.open("wb")

    def write(self, ids: np.ndarray) -> None:
        """Append `ids` (any integer array)."""
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        ids.tofile(self._file)
        self.count += len(ids)

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._file.close()


class TokenParts:
    """The token stream stored as part files (one per tokenizing job), read as one array without merging them.

    Supports what the batch code needs: len, slices (a window may span two parts), `np.asarray`; it pickles
    as its file names, so DataLoader workers map the files themselves instead of receiving a copy.
    """

    def __init__(self, files: list[Path], dtype: np.dtype) -> None:
        self.files = [Path(file) for file in files]
        self.dtype = np.dtype(dtype)
        sizes = [file.stat().st_size // self.dtype.itemsize for file in self.files]
        self._arrays = [
            np.memmap(file, dtype=self.dtype, mode="r")
            for file, size in zip(self.files, sizes, strict=True)
            if size
        ]
        self._ends = np.cumsum([len(array) for array in self._arrays], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("TokenParts supports contiguous slices only")
        start, stop, _ = index.indices(len(self))
        pieces = []
        part = int(np.searchsorted(self._ends, start, side="right"))
        while start < stop and part < len(self._arrays):
            part_start = int(self._ends[part]) - len(self._arrays[part])
            take = min(stop, int(self._ends[part])) - start
            pieces.append(self._arrays[part][start - part_start : start - part_start + take])
            start += take
            part += 1
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:]
        return np.asarray(whole, dtype=dtype)

    def tolist(self) -> list[int]:
        return self[:].tolist()

    def __reduce__(self) -> tuple:
        return (TokenParts, ([str(file) for file in self.files], self.dtype.str))


def publish_token_folder(staged: StagedFolder, name: str) -> Path:
    """Publish a complete token folder as `name`; if another process published it first, keep theirs."""
    final = staged.parent / name
    try:
        return staged.publish(name)
    except OSError:
        if not is_complete(final):
            raise
    return final  # leaving the with-block deletes our copy


def is_complete(folder: Path) -> bool:
    """meta.json is written last, and folders only appear by rename, so its presence means complete."""
    return (folder / META_FILE).is_file()


def stream_stats(tokens: np.ndarray, token_bytes: list[bytes]) -> dict[str, int]:
    """Token, UTF-8 byte and character counts of a token stream, without decoding it."""
    byte_counts = np.array([len(piece) for piece in token_bytes], dtype=np.int64)
    # A character starts at every byte that is not a UTF-8 continuation byte (0b10xxxxxx).
    char_counts = np.array(
        [sum(byte & 0xC0 != 0x80 for byte in piece) for piece in token_bytes], dtype=np.int64
    )
    totals = np.zeros(len(token_bytes), dtype=np.int64)
    for start in range(0, len(tokens), _STATS_CHUNK):
        totals += np.bincount(tokens[start : start + _STATS_CHUNK], minlength=len(token_bytes))
    return {
        "tokens": int(len(tokens)),
        "bytes": int(totals @ byte_counts),
        "chars": int(totals @ char_counts),
    }


def finish_token_folder(
    folder: Path, tokenizer: Tokenizer, parts: dict[str, list[str]], details: dict[str, Any]
) -> dict[str, Any]:
    """Write tokenizer.json and then meta.json (part files, counts, bytes and chars per token) into `folder`."""
    dtype = token_dtype(tokenizer.vocab_size)
    token_bytes = tokenizer.token_bytes()
    train = stream_stats(TokenParts([folder / name for name in parts["train"]], dtype), token_bytes)
    val = stream_stats(TokenParts([folder / name for name in parts["val"]], dtype), token_bytes)
    meta = {
        "parts": parts,
        "format": FORMAT_VERSION,
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "eos_id": tokenizer.eos_id,
        "tokenizer_sha256": tokenizer.sha256,
        "train": train,
        "val": val,
        "bytes_per_token": val["bytes"] / val["tokens"],
        "chars_per_token": val["chars"] / val["tokens"],
        **details,
    }
    tokenizer.save(folder / TOKENIZER_FILE)
    (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return meta


@dataclass(frozen=True)
class TokenCache:
    """An opened cache folder: memory-mapped token streams, their tokenizer and meta.json."""

    folder: Path
    train: TokenParts
    val: TokenParts
    tokenizer: Tokenizer
    meta: dict[str, Any]


def open_token_cache(folder: Path) -> TokenCache:
    """Memory-map a complete cache folder read-only."""
    meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    dtype = np.dtype(meta["dtype"])
    return TokenCache(
        folder=folder,
        train=TokenParts([folder / name for name in meta["parts"]["train"]], dtype),
        val=TokenParts([folder / name for name in meta["parts"]["val"]], dtype),
        tokenizer=Tokenizer.from_file(folder / TOKENIZER_FILE),
        meta=meta,
    )
