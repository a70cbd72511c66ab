"""The data on disk, found, built and opened here: the token cache, or for streaming the tokenizer and validation set.

meta.json is written last and a folder gets its final name only once complete, so a crashed run never leaves one
a later run would trust; a killed build leaves `tokens-<sha>.building/` for the next one to finish.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from common.files import (
    StagedFolder,
    missing_folders,
    owner_has_exited,
    remove_if_empty,
    remove_stale,
    stale_temp_files,
)
from data import DataConfigError
from data.batches import TokenParts
from data.cache_records import check_files, damaged, file_records
from data.documents import document_ids, encode_conversations, mask_name, row_digest, row_name
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


def prepare_data(settings: PrepareSettings, before_tokenizing: Callable[[int], None]) -> Path:
    """The complete folder for `settings`, built first if needed; `before_tokenizing(bytes of text left)`."""
    found = find_data(settings)
    if found is not None:
        return found
    if settings.source.streaming:
        return build_stream(settings)
    with new_corpus_dir(settings) as corpus_dir:
        return _build_tokens(settings, corpus_dir, before_tokenizing)


def _build_tokens(
    settings: PrepareSettings, corpus_dir: Path, before_tokenizing: Callable[[int], None]
) -> Path:
    from data.tokenize_parts import plan_parts, tokenize_parts, tokenizer_sample

    source = settings.source
    chat = source.chat_column is not None
    train_docs, val_docs = source.load()
    plan = plan_parts(train_docs, val_docs, source.column, source.key, settings.val_fraction, chat)
    tokenizer = settings.known_tokenizer()
    if tokenizer is None:
        tokenizer = Tokenizer.train(tokenizer_sample(plan.train, source.text_column), settings.vocab_size)
        # Saved before the parts: a resumed build must tokenize with exactly this tokenizer. The folder is made
        # again in case a failed build of the same corpus elsewhere removed it while this one was loading.
        corpus_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(settings.trained_tokenizer_file())
    final = corpus_dir / settings.folder_name(tokenizer)
    building = final.with_name(final.name + ".building")
    building.mkdir(parents=True, exist_ok=True)
    parts = plan.train + plan.val
    before_tokenizing(sum(part.text_bytes for part in parts if not (building / part.name).is_file()))
    procs = settings.num_procs(sum(part.text_bytes for part in parts))
    tokenize_parts(parts, tokenizer, source.column, building, token_dtype(tokenizer.vocab_size), procs, chat)
    names = {"train": [part.name for part in plan.train], "val": [part.name for part in plan.val]}
    details = dict(val_source=plan.val_source, corpus=source.identity(), val_fraction=settings.val_fraction)
    meta = write_meta(building, tokenizer, names, chat, details | {"parts": names, "format": FORMAT_VERSION})
    _publish(final, lambda: building.rename(final))
    shutil.rmtree(building, ignore_errors=True)  # left only where another process published first
    settings.check_sizes(meta)  # after publishing: the folder is good for another block size
    return final


@contextmanager
def new_corpus_dir(settings: PrepareSettings) -> Iterator[Path]:
    """`settings.make_corpus_dir()` for one build: a build that fails (a bad file, a Hub id offline) takes away the
    folders it made (`remove_if_empty`), so a failed start leaves no folder named after its bad input."""
    folder = settings.corpus_dir()
    made = missing_folders(folder)
    settings.make_corpus_dir()
    try:
        yield folder
    except BaseException:
        remove_if_empty(made)
        raise


def publish_token_folder(staged: StagedFolder, name: str) -> Path:
    """Publish a complete staged folder as `name` (leaving the with-block deletes a copy not published)."""
    return _publish(staged.parent / name, lambda: staged.publish(name))


def _publish(final: Path, rename: Callable[[], object]) -> Path:
    """Rename a complete folder in as `final`; if another process (a second node on a shared disk) published it
    first, keep theirs."""
    try:
        rename()
    except OSError:
        if is_complete(final):
            return final
        if final.is_dir():  # folders appear only by rename, complete: this one's meta.json was removed since
            raise damaged(final / META_FILE, "missing") from None
        raise
    return final


def build_stream(settings: PrepareSettings) -> Path:
    """Build the streaming folder (docs/data.md): val.bin (for chat with val.bin.mask), heldout.json, tokenizer.json,
    meta.json; the tokenizer trains on the documents after the held-out ones, so it never sees validation text."""
    source = settings.source
    chat = source.chat_column is not None
    tokenizer = settings.known_tokenizer()
    trained_here = tokenizer is None
    with new_corpus_dir(settings) as corpus_dir, StagedFolder(corpus_dir) as staged:
        assert staged.path is not None
        train_docs, val_docs = source.load()
        head = source.documents(train_docs)
        if val_docs is None:
            validation, val_split = list(islice(head, settings.val_docs)), "train"
            heldout = sorted({row_digest(row) for row in validation if row})
            val_source = f"the first {len(validation)} documents of the train split (left out of training)"
        else:
            validation, val_split = list(islice(source.documents(val_docs), settings.val_docs)), "validation"
            heldout = []
            val_source = f"the first {len(validation)} documents of the validation split"
        if not any(validation):
            raise DataConfigError(
                f"{source.key}: the corpus has no text in column '{source.column}'; point it at real text"
            )
        if tokenizer is None:
            sample = [text for text in islice(head, settings.tokenizer_train_docs) if text]
            if not sample:
                raise DataConfigError(
                    f"data.val_docs: holding out {settings.val_docs} documents leaves none to train the tokenizer "
                    "or the model on; lower data.val_docs or add a validation split"
                )
            tokenizer = Tokenizer.train(sample, settings.vocab_size)
        if chat:  # the held-out conversations, masked as the token cache masks them
            names = (row_name(row, val_split) for row in range(len(validation)))
            val, mask = encode_conversations(tokenizer, validation, names, eos_first=False)
            mask.tofile(staged.path / mask_name(VAL_FILE))
        else:
            val = document_ids(validation, tokenizer)
        val.astype(token_dtype(tokenizer.vocab_size)).tofile(staged.path / VAL_FILE)
        (staged.path / HELDOUT_FILE).write_text(json.dumps(heldout), encoding="utf-8")
        meta = write_meta(staged.path, tokenizer, {"val": [VAL_FILE]}, chat, {"val_source": val_source})
        settings.check_sizes(meta)
        folder = publish_token_folder(staged, settings.folder_name(tokenizer))
    if trained_here:  # after the folder, so a found tokenizer file always means a complete folder
        tokenizer.save(settings.trained_tokenizer_file())
    return folder


def is_complete(folder: Path) -> bool:
    """meta.json is written last, and folders only appear by rename, so its presence means complete."""
    return (folder / META_FILE).is_file()


def read_meta(folder: Path) -> dict[str, Any]:
    """meta.json of a complete folder; a damaged one is one line saying how to rebuild the folder."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise damaged(folder / META_FILE, f"not JSON: {error}") from None
    if not isinstance(meta, dict):
        raise damaged(folder / META_FILE, "not a JSON object")
    return meta


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


def write_meta(
    folder: Path, tokenizer: Tokenizer, files: dict[str, list[str]], chat: bool, details: dict[str, Any]
) -> dict[str, Any]:
    """Write tokenizer.json and then (last: it marks the folder complete) meta.json: each split's counts (for
    `chat`, of the assistant's tokens, the only ones the loss scores) and the bytes per token for val/bpb."""
    masks = {split: [mask_name(name) for name in names] for split, names in files.items()} if chat else None
    stats, token_bytes = {}, tokenizer.token_bytes()
    for split, names in files.items():
        tokens = _open(folder, names, token_dtype(tokenizer.vocab_size))
        if masks is not None:
            tokens = np.asarray(tokens)[np.asarray(_open(folder, masks[split], np.uint8)) != 0]
        stats[split] = stream_stats(tokens, token_bytes)
    val = stats.pop("val")
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "eos_id": tokenizer.eos_id,
        "tokenizer_sha256": tokenizer.sha256,
        "val": val,
        "bytes_per_token": val["bytes"] / max(1, val["tokens"]),
        "chars_per_token": val["chars"] / max(1, val["tokens"]),
        **stats,  # the token cache's train counts
        **({"masks": masks} if masks is not None else {}),
        **details,
    }
    tokenizer.save(folder / TOKENIZER_FILE)
    recorded = [name for names in [*files.values(), *(masks or {}).values()] for name in names]
    recorded += [name for name in (TOKENIZER_FILE, HELDOUT_FILE) if (folder / name).is_file()]
    meta["files"] = file_records(folder, recorded)
    (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return meta


@dataclass(frozen=True)
class DataFolder:
    """An opened folder: memory-mapped tokens (a stream's train tokens are read live), for chat the assistant
    masks (1 where the token is a target), and a stream's held-out document digests."""

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
    check_files(folder, meta)
    files, masks, dtype = meta.get("parts", {"val": [VAL_FILE]}), meta.get("masks", {}), meta["dtype"]
    heldout = [] if "parts" in meta else json.loads((folder / HELDOUT_FILE).read_text(encoding="utf-8"))
    return DataFolder(
        Tokenizer.from_file(folder / TOKENIZER_FILE),
        meta,
        val=_open(folder, files["val"], dtype),
        train=_open(folder, files.get("train"), dtype),
        train_mask=_open(folder, masks.get("train"), np.uint8),
        val_mask=_open(folder, masks.get("val"), np.uint8),
        heldout=frozenset(heldout),
    )


def _open(folder: Path, names: list[str] | None, dtype: Any) -> Any:
    """The files `names` of `folder` as one TokenParts stream (None for None)."""
    return None if names is None else TokenParts([folder / name for name in names], np.dtype(dtype))


def sweep_data_cache(cache_dir: Path, say: Callable[[str], None]) -> list[Path]:
    """Remove what killed builds left under `cache_dir/<corpus>/`; say so. Runs building right now share the
    cache, so only temporaries of exited processes on this host go."""
    corpora = [p for p in cache_dir.iterdir() if p.is_dir()] if cache_dir.is_dir() else []
    dead = sorted(temp for corpus in corpora for temp in stale_temp_files(corpus) if owner_has_exited(temp))
    return remove_stale(dead, cache_dir, "data staging folder", say)
