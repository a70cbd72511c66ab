"""Find or build the data a run needs: the token cache (non-streaming) or the streaming folder.

Cache layout (everything for one corpus under one folder keyed by the corpus identity and the hold-out):

    <cache_dir>/<name>-<corpus digest>/
        tokenizer-bpe<V>-<recipe digest>.json   the tokenizer trained here
        tokens-<tokenizer sha256[:16]>/         train-NNNNN.bin, val-NNNNN.bin parts, tokenizer.json, meta.json
        tokens-<...>.building/                  the same while parts are being tokenized (kept for a resume)
        stream-<tokenizer sha256[:16]>-val<N>/  streaming: val.bin, heldout.json, tokenizer.json, meta.json
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.files import StagedFolder
from data.errors import DataConfigError
from data.fingerprint import stable_digest
from data.source import CorpusSource
from data.token_store import (
    FORMAT_VERSION,
    META_FILE,
    finish_token_folder,
    is_complete,
    publish_token_folder,
    token_dtype,
)
from data.tokenizer import Tokenizer

# Bump when the tokenizer's training recipe changes, so caches made by the old recipe are not reused.
TOKENIZER_RECIPE = "bytelevel-bpe/min_frequency=2/sample=64MB/v2"
_BYTES_PER_PROCESS = 4 << 20  # below this, starting a worker process costs more than it saves


@dataclass(frozen=True)
class PrepareSettings:
    """Everything that decides the token cache's contents, plus the block size validation must fit."""

    source: CorpusSource
    cache_dir: Path
    vocab_size: int
    tokenizer_path: Path | None = None
    val_fraction: float = 0.1
    num_proc: int | None = None
    tokenizer_train_docs: int = 10_000
    val_docs: int = 1000
    val_block_size: int = 1
    pretrained_tokenizer: Tokenizer | None = (
        None  # a pretrained model's own (model.init_from): none is trained
    )

    def corpus_dir(self) -> Path:
        """The folder for this corpus and hold-out; its name changes when any input file changes."""
        digest = stable_digest(self.source.identity(), self.val_fraction, FORMAT_VERSION, length=16)
        return self.cache_dir / f"{_readable_name(self.source)}-{digest}"

    def trained_tokenizer_file(self) -> Path:
        """Where the tokenizer trained on this corpus is kept, so a second run knows its sha256 without work."""
        recipe = [
            TOKENIZER_RECIPE,
            self.vocab_size,
            [self.tokenizer_train_docs, self.val_docs] if self.source.streaming else None,
        ]
        return self.corpus_dir() / f"tokenizer-bpe{self.vocab_size}-{stable_digest(recipe, length=12)}.json"


def stream_folder_name(tokenizer: Tokenizer, settings: PrepareSettings) -> str:
    """The streaming folder (tokenizer, validation tokens) is keyed by the tokenizer and the hold-out size."""
    return f"stream-{tokenizer.sha256[:16]}-val{settings.val_docs}"


def find_stream(settings: PrepareSettings) -> Path | None:
    """The complete streaming folder for `settings`, or None while it is not built."""
    tokenizer = known_tokenizer(settings)
    folder = None if tokenizer is None else settings.corpus_dir() / stream_folder_name(tokenizer, settings)
    return folder if folder is not None and is_complete(folder) else None


def prepare_stream(settings: PrepareSettings) -> Path:
    """Return the streaming folder, building it first if needed: tokenizer.json, val.bin, heldout.json, meta."""
    found = find_stream(settings)
    if found is not None:
        check_val_length(_val_tokens(found), settings.val_block_size)
        return found
    from data.tokenize_stream import build_stream_folder

    tokenizer = known_tokenizer(settings)
    trained_here = tokenizer is None
    source = settings.source
    with StagedFolder(settings.corpus_dir()) as staged:
        assert staged.path is not None
        train_docs, val_docs = source.load()
        tokenizer = build_stream_folder(
            train_docs,
            val_docs,
            column=source.text_column,
            corpus_key=source.key,
            tokenizer=tokenizer,
            vocab_size=settings.vocab_size,
            held_out_docs=settings.val_docs,
            tokenizer_train_docs=settings.tokenizer_train_docs,
            out_dir=staged.path,
        )
        check_val_length(_val_tokens(staged.path), settings.val_block_size)
        folder = publish_token_folder(staged, stream_folder_name(tokenizer, settings))
    if trained_here:  # after the folder, so a found tokenizer file always means a complete folder
        tokenizer.save(settings.trained_tokenizer_file())
    return folder


def _val_tokens(folder: Path) -> int:
    meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    return int(meta["val"]["tokens"])


def token_folder_name(tokenizer: Tokenizer) -> str:
    """Token folders are keyed by the tokenizer's sha256: a retrained tokenizer gets a fresh folder."""
    return f"tokens-{tokenizer.sha256[:16]}"


def find_tokens(settings: PrepareSettings) -> Path | None:
    """The complete token folder for `settings` (checked against the block size), or None while not built."""
    tokenizer = known_tokenizer(settings)
    if tokenizer is None or not is_complete(settings.corpus_dir() / token_folder_name(tokenizer)):
        return None
    folder = settings.corpus_dir() / token_folder_name(tokenizer)
    _check_sizes(folder, settings)
    return folder


def prepare_tokens(settings: PrepareSettings, before_tokenizing: Callable[[int], None] | None = None) -> Path:
    """Return the complete token folder for `settings`, building (or finishing) it first if needed.

    `before_tokenizing` is told how many bytes of text are left to tokenize once that is known. Parts are built in `<folder>.building/`, which a failed or killed run leaves for the next one to finish;
    the folder gets its final name, with meta.json, only once every part is there.
    """
    found = find_tokens(settings)
    if found is not None:
        return found
    from data.tokenize_dataset import plan_parts, tokenizer_sample
    from data.tokenize_parts import tokenize_parts

    source = settings.source
    train_docs, val_docs = source.load()
    plan = plan_parts(train_docs, val_docs, source.text_column, source.key, settings.val_fraction)
    tokenizer = known_tokenizer(settings)
    if tokenizer is None:
        tokenizer = Tokenizer.train(tokenizer_sample(plan.train, source.text_column), settings.vocab_size)
        # Saved before the parts: a resumed build must tokenize with exactly this tokenizer.
        tokenizer.save(settings.trained_tokenizer_file())
    final = settings.corpus_dir() / token_folder_name(tokenizer)
    building = final.with_name(final.name + ".building")
    building.mkdir(parents=True, exist_ok=True)
    parts = plan.train + plan.val
    procs = resolve_num_proc(settings.num_proc, sum(part.text_bytes for part in parts))
    if before_tokenizing is not None:
        before_tokenizing(sum(part.text_bytes for part in parts if not (building / part.name).is_file()))
    dtype = token_dtype(tokenizer.vocab_size)
    tokenize_parts(parts, tokenizer, source.text_column, building, dtype, procs)
    names = {"train": [part.name for part in plan.train], "val": [part.name for part in plan.val]}
    details = {
        "val_source": plan.val_source,
        "corpus": source.identity(),
        "val_fraction": settings.val_fraction,
    }
    finish_token_folder(building, tokenizer, names, details)
    try:
        building.rename(final)
    except OSError:
        if not is_complete(final):  # another process (a second node on a shared disk) finished it first
            raise
        shutil.rmtree(building, ignore_errors=True)
    _check_sizes(final, settings)
    return final


def resolve_num_proc(requested: int | None, total_bytes: int) -> int:
    """`requested`, or for None one process per ~4 MB of text, up to min(8, CPUs)."""
    if requested is not None:
        return max(1, requested)
    return max(1, min(8, os.cpu_count() or 1, total_bytes // _BYTES_PER_PROCESS))


def known_tokenizer(settings: PrepareSettings) -> Tokenizer | None:
    """The pretrained model's tokenizer, the one from `tokenizer_path`, the one trained here earlier, or None."""
    if settings.pretrained_tokenizer is not None:
        return settings.pretrained_tokenizer
    if settings.tokenizer_path is not None:
        return load_tokenizer_setting(settings.tokenizer_path, settings.vocab_size)
    trained = settings.trained_tokenizer_file()
    return Tokenizer.from_file(trained) if trained.is_file() else None


def load_tokenizer_setting(path: Path, vocab_size: int) -> Tokenizer:
    """Load `data.tokenizer_path`, with one-line errors for a missing or foreign file and a too-small vocab."""
    try:
        tokenizer = Tokenizer.from_file(path)
    except FileNotFoundError:
        raise DataConfigError(
            f"data.tokenizer_path: {path} does not exist; pass a tokenizer.json file"
        ) from None
    except ValueError as error:
        raise DataConfigError(f"data.tokenizer_path: {error}") from error
    if tokenizer.vocab_size > vocab_size:
        raise DataConfigError(
            f"data.vocab_size: {vocab_size} is smaller than the {tokenizer.vocab_size} tokens of {path}; "
            f"set data.vocab_size >= {tokenizer.vocab_size}"
        )
    return tokenizer


def _check_sizes(folder: Path, settings: PrepareSettings) -> None:
    meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    if meta["train"]["tokens"] == 0:
        raise DataConfigError(
            f"data.val_fraction: {settings.val_fraction} leaves no training tokens; use a smaller value"
        )
    check_val_length(meta["val"]["tokens"], settings.val_block_size)


def check_val_length(val_tokens: int, block_size: int) -> None:
    """Validation needs at least one window of block_size + 1 tokens (inputs plus shifted targets)."""
    if val_tokens < block_size + 1:
        raise DataConfigError(
            f"data.block_size: the validation stream has {val_tokens} tokens but block_size={block_size} needs "
            f"at least {block_size + 1}; lower data.block_size or hold out more text (data.val_fraction)"
        )


def _readable_name(source: CorpusSource) -> str:
    files = source.resolved_data_files()
    first = next(iter(files.values())) if isinstance(files, dict) else files
    first = first[0] if isinstance(first, list) and first else first
    name = f"{source.dataset}-{Path(first).stem}" if isinstance(first, str) else source.dataset
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:48]
