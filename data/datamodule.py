"""`TextDataModule`: a Hugging Face text corpus as a byte-level BPE token stream for Lightning."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from data.batches import TrainBatches, ValWindows
from data.errors import DataConfigError
from data.prepare import PrepareSettings, load_tokenizer_setting, prepare_tokens
from data.source import CorpusSource, SampleBy
from data.token_store import open_token_cache
from data.tokenizer import MIN_VOCAB_SIZE, Tokenizer

# The default corpus ships with the package (public domain, 1.1 MB), so the default config trains offline.
TINY_SHAKESPEARE = Path(__file__).resolve().parent / "corpora" / "tinyshakespeare.txt"
TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


class TextDataModule(L.LightningDataModule):
    """Loads a text corpus with `datasets`, trains a byte-level BPE tokenizer on its train part, caches the token
    streams as memory-mapped arrays and serves random training windows and sequential validation windows.

    Args:
        dataset: A `datasets` builder reading `data_files` (text, json, parquet, csv, arrow) or a Hub dataset id.
        dataset_config: Hub dataset configuration name (the `name` argument of `load_dataset`).
        data_files: Local paths, globs or URLs for the builder: one, a list, or a dict from split name to files
            (train, validation). Ignored for a Hub id.
        revision: Hub dataset revision (branch, tag or commit) to pin.
        text_column: Column that holds the text of each document.
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
        streaming: Stream the corpus instead of materialising it (tokenizes on the fly; the tokenizer trains on
            the first tokenizer_train_docs documents; the hold-out is then the last val_fraction of tokens).
        val_fraction: Without a validation split, the fraction of the train text held out for validation (the
            last characters, as nanoGPT does).
        num_proc: Processes for tokenizing; None picks one per ~4 MB of text, up to min(8, CPUs).
        tokenizer_train_docs: With streaming, how many leading documents train the tokenizer.
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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = CorpusSource(
            dataset, dataset_config, data_files, revision, text_column, text_sample_by, streaming
        )
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.settings = PrepareSettings(
            source=self.source,
            cache_dir=Path(cache_dir).expanduser(),
            vocab_size=vocab_size,
            tokenizer_path=Path(tokenizer_path).expanduser() if tokenizer_path else None,
            val_fraction=val_fraction,
            num_proc=num_proc,
            tokenizer_train_docs=tokenizer_train_docs,
            val_block_size=block_size,
        )
        self._check_settings()
        self.tokenizer: Tokenizer | None = None
        self.train_tokens: np.ndarray | None = None
        self.val_tokens: np.ndarray | None = None
        self.meta: dict[str, Any] = {}

    def _check_settings(self) -> None:
        """Cheap checks, so a bad config fails when it is parsed rather than minutes into preparation."""
        settings = self.settings
        _require(
            self.vocab_size >= MIN_VOCAB_SIZE,
            "data.vocab_size",
            f"{self.vocab_size} is below {MIN_VOCAB_SIZE} (256 bytes + <|endoftext|>); use at least that",
        )
        _require(self.block_size > 0, "data.block_size", f"must be positive, got {self.block_size}")
        _require(self.batch_size > 0, "data.batch_size", f"must be positive, got {self.batch_size}")
        _require(self.num_workers >= 0, "data.num_workers", f"must be >= 0, got {self.num_workers}")
        _require(
            0 < settings.val_fraction < 1,
            "data.val_fraction",
            f"must be between 0 and 1 (exclusive), got {settings.val_fraction}",
        )
        _require(
            settings.num_proc is None or settings.num_proc > 0,
            "data.num_proc",
            f"must be positive or null, got {settings.num_proc}",
        )
        _require(
            settings.tokenizer_train_docs > 0,
            "data.tokenizer_train_docs",
            f"must be positive, got {settings.tokenizer_train_docs}",
        )
        self.source.check()
        if settings.tokenizer_path is not None:
            load_tokenizer_setting(settings.tokenizer_path, self.vocab_size)

    def prepare_data(self) -> None:
        """Download, train the tokenizer and tokenize once (Lightning calls this on one process per node)."""
        prepare_tokens(self.settings)

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the token streams and load the tokenizer (prepares them first when nothing has)."""
        if self.train_tokens is not None:
            return
        cache = open_token_cache(prepare_tokens(self.settings))  # checks the validation length for block_size
        self.tokenizer = cache.tokenizer
        self.train_tokens = cache.train
        self.val_tokens = cache.val
        self.meta = cache.meta

    @property
    def bytes_per_token(self) -> float:
        """UTF-8 bytes per validation token: val/bpb = val_loss / ln 2 / bytes_per_token."""
        return self._meta_value("bytes_per_token")

    @property
    def chars_per_token(self) -> float:
        """Characters per validation token, to compare with character-level baselines."""
        return self._meta_value("chars_per_token")

    def train_batches(self, start_batch: int = 0, rank: int = 0, world_size: int = 1) -> TrainBatches:
        """The endless training batch sequence of one rank, starting at `start_batch`."""
        self._require_setup()
        assert self.train_tokens is not None
        return TrainBatches(
            self.train_tokens,
            self.block_size,
            self.batch_size,
            self.seed,
            rank=rank,
            world_size=world_size,
            start_batch=start_batch,
        )

    def train_dataloader(self) -> DataLoader:
        """Resumes where the attached trainer stands: batch global_step * accumulate_grad_batches."""
        trainer = self.trainer
        if trainer is None:
            batches = self.train_batches()
        else:
            start = trainer.global_step * trainer.accumulate_grad_batches
            batches = self.train_batches(start, trainer.global_rank, trainer.world_size)
        return DataLoader(
            batches,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            worker_init_fn=leave_ctrl_c_to_the_main_process,
        )

    def val_dataloader(self) -> DataLoader:
        """Every validation window once, in order (Lightning adds a DistributedSampler under DDP)."""
        self._require_setup()
        assert self.val_tokens is not None
        # Persistent workers: validation runs many times, and restarting workers each time costs seconds.
        return DataLoader(
            ValWindows(self.val_tokens, self.block_size),
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
            worker_init_fn=leave_ctrl_c_to_the_main_process,
        )

    def _meta_value(self, key: str) -> float:
        self._require_setup()
        return float(self.meta[key])

    def _require_setup(self) -> None:
        if self.train_tokens is None:
            raise RuntimeError(
                "TextDataModule: call setup() (or let the Trainer call it) before using the data"
            )


def leave_ctrl_c_to_the_main_process(worker_id: int) -> None:
    """DataLoader workers ignore Ctrl-C: a terminal sends it to every process of the job, and a worker that died
    of it would end the run with "worker exited unexpectedly" instead of the trainer's save at a step boundary."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _require(condition: bool, key: str, problem: str) -> None:
    if not condition:
        raise DataConfigError(f"{key}: {problem}")
