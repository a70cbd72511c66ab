"""The token cache on disk: one folder of flat token part files, tokenizer.json and meta.json; finding or building it.

`meta.json` lists the train and validation part files in order and records what training needs to report bits
per byte. It is written last, and the folder only gets its final name once complete, so a crashed run never
leaves a folder a later run would trust. Parts are built in `tokens-<sha>.building/`, which a killed build leaves
for the next one to finish; its temporary files live next to it, never inside (see data/tokenize_parts.py), so
what is published holds only whole parts. The streaming folder (data/stream.py) follows the same rules; both are
found, built and opened here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.files import StagedFolder, owner_has_exited, remove_stale, stale_temp_files
from data.settings import FORMAT_VERSION, PrepareSettings
from data.tokenizer import Tokenizer

META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
VAL_FILE = "val.bin"  # a streaming folder's validation tokens
HELDOUT_FILE = "heldout.json"  # and the digests of the train documents it holds out
_STATS_CHUNK = 1 << 24


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab <= 65536): half the disk and page cache of uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def find_data(settings: PrepareSettings) -> Path | None:
    """The complete folder for `settings` (checked against the block size), or None while not built."""
    tokenizer = settings.known_tokenizer()
    folder = None if tokenizer is None else settings.corpus_dir() / settings.folder_name(tokenizer)
    if folder is None or not is_complete(folder):
        return None
    settings.check_sizes(read_meta(folder))
    return folder


def prepare_data(settings: PrepareSettings, before_tokenizing: Callable[[int], None] | None = None) -> Path:
    """Return the complete folder for `settings` (the token cache, or the streaming one), building or finishing
    it first if needed. `before_tokenizing` is told how many bytes of text are left to tokenize once known."""
    found = find_data(settings)
    if found is not None:
        return found
    if settings.source.streaming:
        from data.stream import build_stream

        return build_stream(settings)
    from data.tokenize_parts import mask_name, plan_parts, tokenize_parts, tokenizer_sample

    corpus_dir = settings.make_corpus_dir()
    source = settings.source
    chat = source.chat_column is not None
    train_docs, val_docs = source.load()
    plan = plan_parts(train_docs, val_docs, source.column, source.key, settings.val_fraction, chat)
    tokenizer = settings.known_tokenizer()
    if tokenizer is None:
        tokenizer = Tokenizer.train(tokenizer_sample(plan.train, source.text_column), settings.vocab_size)
        # Saved before the parts: a resumed build must tokenize with exactly this tokenizer.
        tokenizer.save(settings.trained_tokenizer_file())
    final = corpus_dir / settings.folder_name(tokenizer)
    building = final.with_name(final.name + ".building")
    building.mkdir(parents=True, exist_ok=True)
    parts = plan.train + plan.val
    if before_tokenizing is not None:
        before_tokenizing(sum(part.text_bytes for part in parts if not (building / part.name).is_file()))
    procs = settings.num_procs(sum(part.text_bytes for part in parts))
    tokenize_parts(parts, tokenizer, source.column, building, token_dtype(tokenizer.vocab_size), procs, chat)
    names = {"train": [part.name for part in plan.train], "val": [part.name for part in plan.val]}
    details = {
        "val_source": plan.val_source,
        "corpus": source.identity(),
        "val_fraction": settings.val_fraction,
    }
    masks = {split: [mask_name(name) for name in files] for split, files in names.items()} if chat else None
    meta = finish_token_folder(building, tokenizer, names, details, masks)
    try:
        building.rename(final)
    except OSError:
        if not is_complete(final):  # another process (a second node on a shared disk) finished it first
            raise
        shutil.rmtree(building, ignore_errors=True)
    settings.check_sizes(meta)  # after publishing: the folder is good for another block size
    return final


class TokenParts:
    """The token stream stored as part files, read as one array without merging them: len, slices (a window may
    span two parts), `np.asarray`; it pickles as its file names, so DataLoader workers map the files themselves."""

    def __init__(self, files: list[Path], dtype: np.dtype) -> None:
        self.files = [Path(file) for file in files]
        self.dtype = np.dtype(dtype)
        self._arrays = [
            np.memmap(file, dtype=self.dtype, mode="r") for file in self.files if file.stat().st_size
        ]
        self._ends = np.cumsum([len(array) for array in self._arrays], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

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
        return np.asarray(self[:], dtype=dtype)

    def tolist(self) -> list[int]:
        return self[:].tolist()

    def __reduce__(self) -> tuple:
        return (TokenParts, ([str(file) for file in self.files], self.dtype.str))


def publish_token_folder(staged: StagedFolder, name: str) -> Path:
    """Publish a complete staged folder as `name`; if another process published it first, keep theirs."""
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


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / META_FILE).read_text(encoding="utf-8"))


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


def write_meta(folder: Path, tokenizer: Tokenizer, val: dict[str, int], details: dict[str, Any]) -> dict:
    """Write tokenizer.json and then (last: it marks the folder complete) meta.json into `folder`."""
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "eos_id": tokenizer.eos_id,
        "tokenizer_sha256": tokenizer.sha256,
        "val": val,
        "bytes_per_token": val["bytes"] / max(1, val["tokens"]),
        "chars_per_token": val["chars"] / max(1, val["tokens"]),
        **details,
    }
    tokenizer.save(folder / TOKENIZER_FILE)
    (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return meta


def finish_token_folder(
    folder: Path,
    tokenizer: Tokenizer,
    parts: dict[str, list[str]],
    details: dict[str, Any],
    masks: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """meta.json for the part files: their names, token/byte/char counts and the bytes per token for val/bpb;
    with assistant `masks` (chat) the counts are of the assistant's tokens, the only ones the loss scores."""
    dtype = token_dtype(tokenizer.vocab_size)
    stats = {}
    for split, names in parts.items():
        tokens = TokenParts([folder / name for name in names], dtype)
        if masks is not None:
            tokens = np.asarray(tokens)[np.asarray(_open_masks(folder, masks[split])) != 0]
        stats[split] = stream_stats(tokens, tokenizer.token_bytes())
    details = {**details, "parts": parts, "format": FORMAT_VERSION, "train": stats["train"]}
    if masks is not None:
        details["masks"] = masks
    return write_meta(folder, tokenizer, stats["val"], details)


@dataclass(frozen=True)
class DataFolder:
    """An opened folder: memory-mapped validation tokens, the tokenizer and meta.json; for a token cache the
    training tokens and for chat the assistant masks (one uint8 per token, 1 where the loss counts the token as
    a target); for a streaming folder the digests of the held-out documents training skips."""

    folder: Path
    tokenizer: Tokenizer
    meta: dict[str, Any]
    val: TokenParts
    train: TokenParts | None = None
    train_mask: TokenParts | None = None
    val_mask: TokenParts | None = None
    heldout: frozenset[str] = frozenset()


def open_data(folder: Path) -> DataFolder:
    """Memory-map a complete folder (token cache or streaming) read-only."""
    meta = read_meta(folder)
    dtype = np.dtype(meta["dtype"])
    tokenizer = Tokenizer.from_file(folder / TOKENIZER_FILE)
    if "parts" not in meta:
        heldout = json.loads((folder / HELDOUT_FILE).read_text(encoding="utf-8"))
        val = TokenParts([folder / VAL_FILE], dtype)
        return DataFolder(folder, tokenizer, meta, val, heldout=frozenset(heldout))
    parts, masks = meta["parts"], meta.get("masks")
    return DataFolder(
        folder,
        tokenizer,
        meta,
        val=TokenParts([folder / name for name in parts["val"]], dtype),
        train=TokenParts([folder / name for name in parts["train"]], dtype),
        train_mask=None if masks is None else _open_masks(folder, masks["train"]),
        val_mask=None if masks is None else _open_masks(folder, masks["val"]),
    )


def _open_masks(folder: Path, names: list[str]) -> TokenParts:
    return TokenParts([folder / name for name in names], np.dtype(np.uint8))


def sweep_data_cache(cache_dir: Path, say: Callable[[str], None]) -> list[Path]:
    """Remove what killed builds left under `cache_dir/<corpus>/` (staging folders, part temp files); say so.
    The cache is shared by runs that may be building right now, so only a temporary whose name says it was
    made on this host by a process that no longer exists goes (common.files names its owner)."""
    corpora = [p for p in cache_dir.iterdir() if p.is_dir()] if cache_dir.is_dir() else []
    dead = sorted(temp for corpus in corpora for temp in stale_temp_files(corpus) if owner_has_exited(temp))
    return remove_stale(dead, cache_dir, "data staging folder", say)
