"""What decides the data a run needs: the corpus, the hold-out and the tokenizer, the folders named for them, and
the number rules of the `data.*` keys.

Cache layout (everything for one corpus under one folder keyed by the corpus identity and the hold-out):

    <cache_dir>/<name>-<corpus digest>/
        tokenizer-bpe<V>-<recipe digest>.json   the tokenizer trained here
        tokens-<tokenizer sha256[:16]>/         train-NNNNN.bin, val-NNNNN.bin parts, tokenizer.json, meta.json
        tokens-<...>.building/                  the same while parts are being tokenized (kept for a resume)
        stream-<tokenizer sha256[:16]>-val<N>/  streaming: val.bin, heldout.json, tokenizer.json, meta.json
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data import DataConfigError
from data.source import CorpusSource
from data.tokenizer import MIN_VOCAB_SIZE, Tokenizer

FORMAT_VERSION = 2  # of the token cache; 2: part files listed in meta.json
# Bump when the tokenizer's training recipe changes, so caches made by the old recipe are not reused.
TOKENIZER_RECIPE = "bytelevel-bpe/min_frequency=2/sample=64MB/v2"
_BYTES_PER_PROCESS = 4 << 20  # below this, starting a worker process costs more than it saves


def stable_digest(*parts: object, length: int = 32) -> str:
    """Hex digest of JSON-serialisable `parts`; equal inputs give equal digests across runs and machines."""
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:length]


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
    # A pretrained model's own (model.init_from): none is trained.
    pretrained_tokenizer: Tokenizer | None = None

    def corpus_dir(self) -> Path:
        """Its name changes when any input file changes."""
        digest = stable_digest(self.source.identity(), self.val_fraction, FORMAT_VERSION, length=16)
        return self.cache_dir / f"{_readable_name(self.source)}-{digest}"

    def make_corpus_dir(self) -> Path:
        folder = self.corpus_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DataConfigError(
                f"data.cache_dir: cannot create {folder} ({error.strerror}); set data.cache_dir to a folder "
                "you can write to"
            ) from None
        return folder

    def folder_name(self, tokenizer: Tokenizer) -> str:
        """Keyed by the tokenizer's sha256; a stream's also by the size of its hold-out."""
        if self.source.streaming:
            return f"stream-{tokenizer.sha256[:16]}-val{self.val_docs}"
        return f"tokens-{tokenizer.sha256[:16]}"

    def trained_tokenizer_file(self) -> Path:
        """Where the tokenizer trained on this corpus is kept, so a second run knows its sha256 without work."""
        streamed = [self.tokenizer_train_docs, self.val_docs] if self.source.streaming else None
        recipe = [TOKENIZER_RECIPE, self.vocab_size, streamed]
        return self.corpus_dir() / f"tokenizer-bpe{self.vocab_size}-{stable_digest(recipe, length=12)}.json"

    def known_tokenizer(self) -> Tokenizer | None:
        """The pretrained model's tokenizer, the one from `tokenizer_path`, the one trained here earlier, or None;
        for chat, one with a chat template."""
        if self.pretrained_tokenizer is not None:
            tokenizer = self.pretrained_tokenizer
        elif self.tokenizer_path is not None:
            tokenizer = load_tokenizer_setting(self.tokenizer_path, self.vocab_size)
        else:
            trained = self.trained_tokenizer_file()
            tokenizer = Tokenizer.from_file(trained) if trained.is_file() else None
        if self.source.chat_column and (tokenizer is None or tokenizer.chat_template is None):
            what = "a BPE trained here has" if tokenizer is None else "this model's tokenizer has"
            raise DataConfigError(
                f"data.chat_column: conversations are rendered with the model's chat template, and {what} none; "
                "set model.init_from to a chat model (an Instruct one, such as SmolLM2-135M-Instruct)"
            )
        return tokenizer

    def num_procs(self, total_bytes: int) -> int:
        """For None, one process per ~4 MB of text, up to min(8, CPUs); one without fork, as the tokenize workers
        inherit the documents and the tokenizer by forking."""
        forks = "fork" in multiprocessing.get_all_start_methods()
        if self.num_proc is not None and self.num_proc > 1 and not forks:
            raise DataConfigError(
                f"data.num_proc: {self.num_proc} processes need fork, which {sys.platform} lacks; set data.num_proc 1"
            )
        if self.num_proc is not None:
            return max(1, self.num_proc)
        return max(1, min(8 if forks else 1, os.cpu_count() or 1, total_bytes // _BYTES_PER_PROCESS))

    def check_sizes(self, meta: dict[str, Any]) -> None:
        """A folder's meta.json against this run: training tokens left (a stream's meta has no train counts) and
        validation that fits one window of block_size + 1 tokens."""
        if meta.get("train", {}).get("tokens") == 0:
            raise DataConfigError(
                f"data.val_fraction: {self.val_fraction} leaves no training tokens; use a smaller value"
            )
        val_tokens, block_size = meta["val"]["tokens"], self.val_block_size
        if val_tokens < block_size + 1:
            raise DataConfigError(
                f"data.block_size: the validation stream has {val_tokens} tokens but block_size={block_size} "
                f"needs at least {block_size + 1}; lower data.block_size or hold out more text (data.val_fraction)"
            )


def load_tokenizer_setting(path: Path, vocab_size: int) -> Tokenizer:
    """Load `data.tokenizer_path`, with one-line errors."""
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


def _readable_name(source: CorpusSource) -> str:
    files = source.resolved_data_files()
    first = next(iter(files.values())) if isinstance(files, dict) else files
    first = first[0] if isinstance(first, list) and first else first
    name = f"{source.dataset}-{Path(first).stem}" if isinstance(first, str) else source.dataset
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:48]


# The data keys' number rules: (holds, what it must be).
_NUMBER_RULES = {
    "vocab_size": (
        lambda v: v >= MIN_VOCAB_SIZE,
        f"must be at least {MIN_VOCAB_SIZE} (256 bytes + <|endoftext|>)",
    ),
    "block_size": (lambda v: v > 0, "must be positive"),
    "batch_size": (lambda v: v > 0, "must be positive"),
    "num_workers": (lambda v: v >= 0, "must be >= 0"),
    "val_fraction": (lambda v: 0 < v < 1, "must be between 0 and 1 (exclusive)"),
    "num_proc": (lambda v: v is None or v > 0, "must be positive or null"),
    "val_docs": (lambda v: v > 0, "must be positive"),
    "tokenizer_train_docs": (lambda v: v > 0, "must be positive"),
}


def check_numbers(data: Any) -> None:
    """The number rules of the data keys, for the init arguments or a parsed `data:` section (train.py checks it
    before the model, whose sizes follow data's, so the error names the key the user typed)."""
    for key, (holds, rule) in _NUMBER_RULES.items():
        if not holds(data[key]):
            raise DataConfigError(f"data.{key}: {rule}, got {data[key]!r}")
