"""Build the token cache once: find or train the tokenizer, tokenize both splits, publish the folder atomically.

Cache layout (everything for one corpus under one folder keyed by the corpus identity and the hold-out):

    <cache_dir>/<name>-<corpus digest>/
        tokenizer-bpe<V>-<recipe digest>.json   the tokenizer trained here (written after its tokens)
        tokens-<tokenizer sha256[:16]>/         train.bin, val.bin, tokenizer.json, meta.json
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import StagedFolder
from data.errors import DataConfigError
from data.fingerprint import stable_digest
from data.source import CorpusSource
from data.token_store import (
    FORMAT_VERSION,
    TRAIN_FILE,
    VAL_FILE,
    finish_token_folder,
    is_complete,
    publish_token_folder,
    token_dtype,
)
from data.tokenizer import Tokenizer

# Bump when the tokenizer's training recipe changes, so caches made by the old recipe are not reused.
TOKENIZER_RECIPE = "bytelevel-bpe/min_frequency=2/v1"


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
    val_block_size: int = 1

    def corpus_dir(self) -> Path:
        """The folder for this corpus and hold-out; its name changes when any input file changes."""
        digest = stable_digest(self.source.identity(), self.val_fraction, FORMAT_VERSION, length=16)
        return self.cache_dir / f"{_readable_name(self.source)}-{digest}"

    def trained_tokenizer_file(self) -> Path:
        """Where the tokenizer trained on this corpus is kept, so a second run knows its sha256 without work."""
        recipe = [
            TOKENIZER_RECIPE,
            self.vocab_size,
            self.tokenizer_train_docs if self.source.streaming else None,
        ]
        return self.corpus_dir() / f"tokenizer-bpe{self.vocab_size}-{stable_digest(recipe, length=12)}.json"


def token_folder_name(tokenizer: Tokenizer) -> str:
    """Token folders are keyed by the tokenizer's sha256: a retrained tokenizer gets a fresh folder."""
    return f"tokens-{tokenizer.sha256[:16]}"


def prepare_tokens(settings: PrepareSettings) -> Path:
    """Return the complete token folder for `settings`, building it first if needed (a cache hit does no work)."""
    corpus_dir = settings.corpus_dir()
    tokenizer = known_tokenizer(settings)
    if tokenizer is not None and is_complete(corpus_dir / token_folder_name(tokenizer)):
        _check_sizes(
            corpus_dir / token_folder_name(tokenizer), tokenizer, settings
        )  # built for another block_size?
        return corpus_dir / token_folder_name(tokenizer)
    trained_here = tokenizer is None
    with StagedFolder(corpus_dir) as staged:
        assert staged.path is not None
        tokenizer, val_source = _tokenize(settings, tokenizer, staged.path)
        _check_sizes(staged.path, tokenizer, settings)
        details = {
            "val_source": val_source,
            "corpus": settings.source.identity(),
            "val_fraction": settings.val_fraction,
        }
        finish_token_folder(staged.path, tokenizer, details)
        folder = publish_token_folder(staged, token_folder_name(tokenizer))
    if trained_here:
        tokenizer.save(settings.trained_tokenizer_file())
    return folder


def known_tokenizer(settings: PrepareSettings) -> Tokenizer | None:
    """The tokenizer from `tokenizer_path`, or the one trained here by an earlier run, or None."""
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


def _tokenize(settings: PrepareSettings, tokenizer: Tokenizer | None, out_dir: Path) -> tuple[Tokenizer, str]:
    source = settings.source
    train_docs, val_docs = source.load()
    common: dict[str, Any] = {
        "column": source.text_column,
        "corpus_key": source.key,
        "tokenizer": tokenizer,
        "vocab_size": settings.vocab_size,
        "val_fraction": settings.val_fraction,
        "out_dir": out_dir,
    }
    if source.streaming:
        from data.tokenize_stream import tokenize_stream

        return tokenize_stream(
            train_docs, val_docs, tokenizer_train_docs=settings.tokenizer_train_docs, **common
        )
    from data.tokenize_dataset import tokenize_dataset

    return tokenize_dataset(train_docs, val_docs, num_proc=settings.num_proc, **common)


def _check_sizes(folder: Path, tokenizer: Tokenizer, settings: PrepareSettings) -> None:
    itemsize = token_dtype(tokenizer.vocab_size).itemsize
    train_tokens = (folder / TRAIN_FILE).stat().st_size // itemsize
    val_tokens = (folder / VAL_FILE).stat().st_size // itemsize
    if train_tokens == 0:
        raise DataConfigError(
            f"data.val_fraction: {settings.val_fraction} leaves no training tokens; use a smaller value"
        )
    check_val_length(val_tokens, settings.val_block_size)


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
