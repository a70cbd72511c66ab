"""`TextDataModule`: joins the data stages for Lightning (docs/data.md). Local rank 0 builds inside `setup` while the
other ranks poll for its folder: a process-group barrier would give up after the group's timeout (30 min default).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np

from common.errors import UserError, first_line
from common.files import atomic_write
from data import DataConfigError
from data.batches import Loader, TrainBatches, ValWindows
from data.settings import PrepareSettings, check_numbers, load_tokenizer_setting
from data.source import CorpusSource, SampleBy
from data.store import find_data, open_data, prepare_data, sweep_data_cache
from data.stream import PositionedLoader, StreamBatches, saved_positions
from data.tokenizer import Tokenizer

# The default corpus ships with the package (public domain, 1.1 MB), so the default config trains offline.
TINY_SHAKESPEARE = Path(__file__).resolve().parent / "corpora" / "tinyshakespeare.txt"
# Above this much text left to tokenize in setup, a multi-process run is told to use the prepare command.
LARGE_BUILD_BYTES = 1 << 30
POLL_S = 0.2  # how often a waiting rank looks for the folder local rank 0 builds
WAIT_REPORT_S = 60.0


class TextDataModule(L.LightningDataModule):
    """A text corpus as training and validation windows of token ids.

    Loads the corpus with `datasets`, trains a byte-level BPE on its train part (or takes a pretrained model's:
    `use_tokenizer`) and caches its token streams (or streams them). The first line is `--help`'s section title.

    Args:
        dataset: A `datasets` builder reading `data_files` (text, json, parquet, csv, arrow) or a Hub dataset id.
        dataset_config: Hub dataset configuration name (the `name` argument of `load_dataset`).
        data_files: Local paths, globs or URLs for the builder: one, a list, or a dict from split name to files
            (train, validation). Ignored for a Hub id.
        revision: Hub dataset revision (branch, tag or commit) to pin.
        text_column: Column that holds the text of each document.
        chat_column: Fine-tune on conversations instead of text: the column of each row's `messages` (TRL /
            Hugging Face chat format), usually "messages", rendered with the chat template of model.init_from;
            only the assistant's tokens are targets of the loss (docs/finetune.md). Null: plain text.
        text_sample_by: For the text builder: one document per file ("document", keeps newlines), per
            paragraph or per line.
        vocab_size: Tokenizer size to train (at least 257: 256 bytes plus <|endoftext|>); the model's
            embedding size. With tokenizer_path, must be at least that tokenizer's size.
        tokenizer_path: An existing tokenizer.json to use instead of training one.
        block_size: Tokens per training/validation window (the model's context length).
        batch_size: Windows per batch (per device).
        num_workers: DataLoader worker processes.
        seed: Seed of the training windows; batch i on rank r depends only on (seed, i, r).
        cache_dir: Folder for tokenizers and token streams (~ is expanded).
        streaming: Stream the corpus instead of caching its tokens: each rank and DataLoader worker tokenizes its
            own documents during training; the checkpoint holds the stream position for an exact resume.
        val_fraction: Without a validation split, the fraction of the train text held out for validation (the
            last characters, as nanoGPT does).
        num_proc: Processes for tokenizing; None picks one per ~4 MB of text, up to min(8, CPUs) (1 without fork).
        tokenizer_train_docs: With streaming, how many leading documents train the tokenizer.
        val_docs: With streaming, how many documents form the fixed validation set: the first ones of the
            validation split, or else the first ones of the train split, which training then skips.
    """

    def __init__(
        self,
        dataset: str = "text",
        dataset_config: str | None = None,
        data_files: str | list[str] | dict[str, str | list[str]] | None = str(TINY_SHAKESPEARE),
        revision: str | None = None,
        text_column: str = "text",
        text_sample_by: SampleBy = "document",
        vocab_size: int = 1024,
        tokenizer_path: str | None = None,
        block_size: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 1337,
        cache_dir: str = "~/.cache/gqa-gpt",
        streaming: bool = False,
        val_fraction: float = 0.1,
        num_proc: int | None = None,
        tokenizer_train_docs: int = 10_000,
        val_docs: int = 1000,
        chat_column: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = CorpusSource(
            dataset, dataset_config, data_files, revision, text_column, text_sample_by, streaming, chat_column
        )
        self.vocab_size, self.block_size, self.batch_size = vocab_size, block_size, batch_size
        self.num_workers, self.seed = num_workers, seed
        self.settings = PrepareSettings(
            source=self.source,
            cache_dir=Path(cache_dir).expanduser(),
            vocab_size=vocab_size,
            tokenizer_path=Path(tokenizer_path).expanduser() if tokenizer_path else None,
            val_fraction=val_fraction,
            num_proc=num_proc,
            tokenizer_train_docs=tokenizer_train_docs,
            val_docs=val_docs,
            val_block_size=block_size,
        )
        check_numbers(self.hparams)  # the cheap checks: a bad config fails when parsed, not minutes later
        self.source.check()
        if self.settings.tokenizer_path is not None:
            load_tokenizer_setting(self.settings.tokenizer_path, self.vocab_size)
        self._created = time.time()  # a failure note older than this belongs to another run
        self.folder: Path | None = None
        self.tokenizer: Tokenizer | None = None
        self.train_tokens: np.ndarray | None = None
        self.val_tokens: np.ndarray | None = None
        self.train_mask: np.ndarray | None = None  # chat: 1 on the assistant's tokens (data/documents.py)
        self.val_mask: np.ndarray | None = None
        self.heldout: frozenset[str] = frozenset()
        self.meta: dict[str, Any] = {}
        self._stream_state: dict[str, Any] = {}  # from the checkpoint, until the loader takes it over
        self._stream_loader: PositionedLoader | None = None

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Tokenize with a pretrained model's tokenizer (model.init_from) instead of training one; before `setup`."""
        if tokenizer.vocab_size > self.vocab_size:
            raise DataConfigError(
                f"data.vocab_size: {self.vocab_size} is smaller than the pretrained tokenizer's "
                f"{tokenizer.vocab_size} ids"
            )
        self.settings = dataclasses.replace(self.settings, pretrained_tokenizer=tokenizer)
        self.tokenizer = None

    def setup(self, stage: str | None = None) -> None:
        """Find or build the data (local rank 0 builds, the other ranks wait on its files), then open it."""
        if self.tokenizer is not None:
            return
        trainer = self.trainer
        if trainer is None or trainer.local_rank == 0:
            sweep_data_cache(self.settings.cache_dir, lambda line: print(line, file=sys.stderr))
            others_wait = trainer is not None and trainer.world_size > 1
            self.folder = find_data(self.settings) or self._build(others_wait)
        else:
            self.folder = self._wait()
        opened = open_data(self.folder)
        self.tokenizer, self.meta, self.heldout = opened.tokenizer, opened.meta, opened.heldout
        self.train_tokens, self.val_tokens = opened.train, opened.val  # a stream tokenizes as it trains
        self.train_mask, self.val_mask = opened.train_mask, opened.val_mask

    def _failure_note(self) -> Path:
        return self.settings.cache_dir / f".failed-{self.settings.corpus_dir().name}"

    def _build(self, others_wait: bool) -> Path:
        try:
            return prepare_data(self.settings, self._hint)
        except BaseException as error:
            if others_wait:  # the one line the waiting ranks stop with
                is_user = isinstance(error, UserError)
                line = str(error) if is_user else f"{type(error).__name__}: {first_line(error)}"
                atomic_write(self._failure_note(), line or type(error).__name__)
            raise

    def _wait(self) -> Path:
        what = "the streaming tokenizer and validation set" if self.source.streaming else "the token cache"
        began = last_report = time.monotonic()
        note = self._failure_note()
        while (found := find_data(self.settings)) is None:
            if note.is_file() and note.stat().st_mtime >= self._created - 1:
                raise DataConfigError(f"{what}: local rank 0 failed: {note.read_text(encoding='utf-8')}")
            if time.monotonic() - last_report >= WAIT_REPORT_S:
                last_report = time.monotonic()
                print(
                    f"waiting for local rank 0 to build {what} ({last_report - began:.0f} s)", file=sys.stderr
                )
            time.sleep(POLL_S)
        return found

    def _hint(self, text_bytes: int) -> None:
        """A DDP run tokenizing a large corpus in setup keeps every other process idle: name the way out."""
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if world_size > 1 and text_bytes > LARGE_BUILD_BYTES:
            print(
                f"data: tokenizing {text_bytes / 1e9:.1f} GB of text before step 1 while {world_size - 1} other "
                "processes wait; next time run `python -m data.prepare --config <this config>` (same --data.* "
                "flags) first, and fit starts at once",
                file=sys.stderr,
                flush=True,
            )

    @property
    def bytes_per_token(self) -> float:
        """UTF-8 bytes per validation token: val/bpb = val_loss / ln 2 / bytes_per_token."""
        self._require_setup()
        return float(self.meta["bytes_per_token"])

    @property
    def chars_per_token(self) -> float:
        """Characters per validation token, to compare with character-level baselines."""
        self._require_setup()
        return float(self.meta["chars_per_token"])

    def train_batches(self, start_batch: int = 0, rank: int = 0, world_size: int = 1) -> TrainBatches:
        """The endless training batch sequence of one rank, starting at `start_batch`."""
        self._require_setup()
        assert self.train_tokens is not None
        return TrainBatches(
            self.train_tokens, self.block_size, self.batch_size, self.seed, rank, world_size, start_batch,
            mask=self.train_mask,
        )  # fmt: skip

    def train_dataloader(self) -> Loader:
        """Resumes where the attached trainer stands (see `_start_batch`)."""
        trainer = self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        start_batch = self._start_batch()
        if not self.source.streaming:
            batches = self.train_batches(start_batch, rank, world_size)
            return Loader(batches, batch_size=None, num_workers=self.num_workers)
        self._require_setup()
        start = saved_positions(self._stream_state, world_size, self.num_workers)
        batches = StreamBatches(
            self.source.load()[0], self.source.column, self.tokenizer, self.heldout, self.block_size,
            self.batch_size, rank, world_size, start, start_batch, chat=self.source.chat_column is not None,
        )  # fmt: skip
        self._stream_loader = PositionedLoader(batches, self.num_workers)
        return self._stream_loader

    def _start_batch(self) -> int:
        """The batches a trainer at optimizer step s has trained, where the loaders and a stream position resume."""
        trainer = self.trainer
        return trainer.global_step * trainer.accumulate_grad_batches if trainer is not None else 0

    def val_dataloader(self) -> Loader:
        """Every validation window once, in order (Lightning adds a DistributedSampler under DDP)."""
        self._require_setup()
        # Persistent workers: validation runs many times, and restarting workers each time costs seconds.
        return Loader(
            ValWindows(self.val_tokens, self.block_size, self.val_mask),
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def state_dict(self) -> dict[str, Any]:
        """The stream position after the last trained batch of every reader of every rank (streaming only)."""
        if self._stream_loader is None or self.trainer is None:
            return {"stream": self._stream_state} if self._stream_state else {}
        return {"stream": self._stream_loader.state(self._start_batch())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._stream_state = state_dict.get("stream", {})

    def _require_setup(self) -> None:
        if self.tokenizer is None:
            raise RuntimeError(
                "TextDataModule: call setup() (or let the Trainer call it) before using the data"
            )
