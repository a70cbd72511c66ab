"""Streaming (`data.streaming: true`): training batches tokenized live by readers, resumed exactly (docs/data.md).

Reader rank * num_workers + w is DataLoader worker w of a rank, with its own documents (`split_dataset_by_node`).
The DataLoader takes batches from its workers in turn, so a loader resumed at batch s gives worker w the reader of
batch s + w. With each batch a reader sends its position; `PositionedLoader` gives the checkpoint the one after the
last batch trained on, not the ones the DataLoader prefetched.
"""

from __future__ import annotations

import copy
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from data import DataConfigError
from data.batches import Loader, masked_pair, worker_slot
from data.documents import document_ids, encode_conversations, row_digest, row_name
from data.tokenizer import Tokenizer

DOCS_PER_CHUNK = 64
# {"epoch", "hf" (datasets state or None), "rows" (read this epoch, for errors), "skip" (tokens), "batches"}
ReaderState = dict[str, Any]
Chunk = tuple[ReaderState, np.ndarray, np.ndarray | None]  # position before, tokens, assistant mask or None
ReaderBatch = tuple[torch.Tensor, torch.Tensor, int, ReaderState]  # x, y, reader, position after it


def fresh_state() -> ReaderState:
    return {"epoch": 0, "hf": None, "rows": 0, "skip": 0, "batches": 0}


@dataclass
class StreamBatches(IterableDataset):
    """Endless (x, y, reader, state) batches of this rank's readers; `PositionedLoader` strips the last two."""

    docs: Any
    column: str
    tokenizer: Tokenizer
    heldout: frozenset[str]
    block_size: int
    batch_size: int
    rank: int = 0
    world_size: int = 1
    start: dict[int, ReaderState] = field(default_factory=dict)  # each reader's saved position
    start_batch: int = 0
    chat: bool = False  # the column holds conversations: tokens carry the assistant mask (data/documents.py)

    def __iter__(self) -> Iterator[ReaderBatch]:
        worker_id, num_workers = worker_slot()
        reader = self.rank * num_workers + (self.start_batch + worker_id) % num_workers
        yield from self.reader_batches(reader, self.world_size * num_workers)

    def reader_batches(self, reader: int, readers: int) -> Iterator[ReaderBatch]:
        """Batches of one reader, from its saved position (or the start)."""
        state = copy.deepcopy(self.start.get(reader, fresh_state()))
        chunks = self._chunks(reader, readers, state)
        held: deque[Chunk] = deque()
        head = state["skip"]  # tokens of held[0] already used
        batches = state["batches"]
        need = self.batch_size * self.block_size + 1

        def windows(column: int) -> np.ndarray:  # (B, T + 1) of the held tokens (column 1) or masks (2)
            flat = np.concatenate([chunk[column] for chunk in held])[head : head + need]
            return np.lib.stride_tricks.sliding_window_view(flat, self.block_size + 1)[:: self.block_size]

        while True:
            while sum(len(tokens) for _, tokens, _ in held) - head < need:
                held.append(next(chunks))
            batch = masked_pair(windows(1), windows(2) if self.chat else None)
            head += need - 1
            while held and head >= len(held[0][1]):
                head -= len(held.popleft()[1])
            batches += 1
            # The window's last token starts the next batch, so held is never empty here.
            position = {**held[0][0], "skip": head, "batches": batches}
            yield *batch, reader, position

    def _chunks(self, reader: int, readers: int, state: ReaderState) -> Iterator[Chunk]:
        """The reader's chunks, epoch after epoch."""
        from datasets.distributed import split_dataset_by_node

        epoch, hf_state, rows = state["epoch"], state["hf"], state.get("rows", 0)
        while True:
            docs = split_dataset_by_node(self.docs, rank=reader, world_size=readers)
            docs.set_epoch(epoch)
            if hf_state is not None:
                docs.load_state_dict(hf_state)
            # Whole files per reader, or every readers-th row (then its rows' numbers in the split are known).
            by_file = readers > 1 and self.docs.n_shards % readers == 0
            before = {"epoch": epoch, "hf": hf_state, "rows": rows}
            produced = 0
            for batch in docs.iter(batch_size=DOCS_PER_CHUNK):
                column = batch[self.column]
                tokens, mask = self._encode(column, rows, reader, readers, by_file)
                rows += len(column)
                after = {"epoch": epoch, "hf": docs.state_dict(), "rows": rows}
                if len(tokens):
                    produced += len(tokens)
                    yield before, tokens, mask
                before = after
            if produced == 0 and hf_state is None:
                raise DataConfigError(
                    f"data.num_workers: stream reader {reader} of {readers} (ranks x workers) got no training "
                    "documents; use fewer data.num_workers or a corpus with more documents or files"
                )
            epoch, hf_state, rows = epoch + 1, None, 0

    def _encode(
        self, column: list, rows: int, reader: int, readers: int, by_file: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(tokens, assistant mask or None) of a chunk's documents but the held-out ones; the chunk starts at
        the reader's row `rows` of this epoch."""
        if not self.chat:
            texts = [text for text in column if text and row_digest(text) not in self.heldout]
            return document_ids(texts, self.tokenizer), None
        kept = [(rows + k, row) for k, row in enumerate(column) if row_digest(row) not in self.heldout]
        names = (
            f"data.chat_column: row {k} of stream reader {reader}'s files (of {readers} readers)"
            if by_file
            else row_name(reader + k * readers, "train")
            for k, _ in kept
        )
        return encode_conversations(self.tokenizer, [row for _, row in kept], names, eos_first=True)


class PositionedLoader(Loader):
    """A DataLoader over `StreamBatches` that yields (x, y) and records every reader's position after each of
    its batches, for the checkpoint (`state`)."""

    def __init__(self, batches: StreamBatches, num_workers: int) -> None:
        if num_workers:
            # Each worker tokenizes on one core; the Rust pool of every worker would oversubscribe the CPU.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        super().__init__(batches, batch_size=None, num_workers=num_workers)
        self.batches = batches
        self.readers = [batches.rank * max(1, num_workers) + w for w in range(max(1, num_workers))]
        self.start = {reader: batches.start.get(reader, fresh_state()) for reader in self.readers}
        self.history: dict[int, deque[ReaderState]] = {reader: deque(maxlen=256) for reader in self.readers}

    def __iter__(self):
        for x, y, reader, state in super().__iter__():
            self.history[int(reader)].append(state)
            yield x, y

    def positions(self, trained_batches: int) -> dict[int, ReaderState]:
        """Each of this rank's readers' position after `trained_batches` (counted like start_batch)."""
        positions = {}
        for index, reader in enumerate(self.readers):
            own = self._turns(trained_batches, index) - self._turns(self.batches.start_batch, index)
            target = self.start[reader]["batches"] + own
            match = [state for state in self.history[reader] if state["batches"] == target]
            if own and not match:
                raise RuntimeError(f"stream reader {reader}: no recorded position for its batch {target}")
            positions[reader] = match[-1] if own else self.start[reader]
        return positions

    def _turns(self, batches: int, index: int) -> int:
        """How many of the batches 0 .. batches - 1 came from reader index `index` (those with g % n == index)."""
        return max(0, -(-(batches - index) // len(self.readers)))

    def state(self, trained_batches: int) -> dict[str, Any]:
        """Every rank's reader positions after `trained_batches` (a collective under DDP: Lightning builds the
        checkpoint dict on every rank)."""
        import torch.distributed as dist

        mine, world_size = self.positions(trained_batches), self.batches.world_size
        parts: list[Any] = [mine]
        if world_size > 1 and dist.is_available() and dist.is_initialized():
            parts = [None] * world_size
            dist.all_gather_object(parts, mine)
        readers = {reader: state for part in parts for reader, state in part.items()}
        return {"world_size": world_size, "num_workers": self.num_workers, "readers": readers}


def saved_positions(saved: dict[str, Any], world_size: int, num_workers: int) -> dict[int, ReaderState]:
    """The readers' positions of a checkpoint's stream state; refuses another process or worker count."""
    if not saved:
        return {}
    if (saved["world_size"], saved["num_workers"]) != (world_size, num_workers):
        raise DataConfigError(
            f"data.num_workers: the checkpoint's stream position is for {saved['world_size']} processes x "
            f"{saved['num_workers']} workers; resume with the same process count and "
            f"--data.num_workers {saved['num_workers']} (now {world_size} x {num_workers})"
        )
    return {int(reader): state for reader, state in saved["readers"].items()}
