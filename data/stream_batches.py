"""On-the-fly training batches for `data.streaming: true`: every reader tokenizes its own documents and packs them.

A reader is one DataLoader worker of one rank, out of world_size * num_workers. The DataLoader takes batches
from its workers in turn, worker 0 first, so the rank's batch g (counted from the start of training) comes from
reader rank * num_workers + g % num_workers; a loader resumed at batch s gives worker w that reader for g = s + w,
so the readers take their turns in the same order as in an uninterrupted run. `datasets.distributed.split_dataset_by_node` gives each reader whole shards (files) when their
count is a multiple of the readers, and every readers-th document otherwise, so no two readers share a
document. A reader tokenizes documents in chunks of `DOCS_PER_CHUNK`, each document after one `<|endoftext|>`,
into one token stream; batch k of the reader is the next batch_size windows of block_size + 1 tokens, back to
back (a window's last token starts the next one, as in the token cache).

Exact resume: with each batch the reader sends its position, the `datasets` state before the oldest chunk
whose tokens it still holds plus how many of that chunk's tokens it has used. `LoaderPosition` keeps these in
the main process and gives the checkpoint the position after the last batch that was trained on, not the
ones the DataLoader prefetched.
"""

from __future__ import annotations

import copy
import hashlib
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from data.errors import DataConfigError
from data.segments import encode_segments, segment_documents
from data.tokenizer import Tokenizer

DOCS_PER_CHUNK = 64
ReaderState = dict[str, Any]  # {"epoch", "hf" (datasets state or None), "skip" (tokens), "batches"}


def document_digest(text: str) -> str:
    """Identifies a held-out validation document, so readers can leave it out of training."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def fresh_state() -> ReaderState:
    return {"epoch": 0, "hf": None, "skip": 0, "batches": 0}


def document_ids(texts: list[str | None], tokenizer: Tokenizer) -> np.ndarray:
    """Ids of `texts` as one stream, EOS (and BOS if the tokenizer adds one) before every non-empty document."""
    pieces = encode_segments(tokenizer, segment_documents(texts, [False] * len(texts)))
    return np.fromiter((i for piece in pieces for i in piece), dtype=np.int64)


class StreamBatches(IterableDataset):
    """Endless (x, y, reader, state) batches of this rank's readers; `LoaderPosition` strips the last two."""

    def __init__(
        self,
        docs: Any,
        column: str,
        tokenizer: Tokenizer,
        heldout: frozenset[str],
        block_size: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        start: dict[int, ReaderState] | None = None,
        start_batch: int = 0,
    ) -> None:
        self.docs = docs
        self.column = column
        self.tokenizer = tokenizer
        self.heldout = heldout
        self.block_size = block_size
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.start = start or {}
        self.start_batch = start_batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, ReaderState]]:
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        reader = self.rank * num_workers + (self.start_batch + worker_id) % num_workers
        yield from self.reader_batches(reader, self.world_size * num_workers)

    def reader_batches(
        self, reader: int, readers: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, ReaderState]]:
        """Batches of one reader, from its saved position (or the start)."""
        state = copy.deepcopy(self.start.get(reader, fresh_state()))
        chunks = self._chunks(reader, readers, state)
        held: deque[tuple[ReaderState, np.ndarray]] = deque()
        head = state["skip"]  # tokens of held[0] already used
        batches = state["batches"]
        need = self.batch_size * self.block_size + 1
        while True:
            while sum(len(tokens) for _, tokens in held) - head < need:
                held.append(next(chunks))
            flat = np.concatenate([tokens for _, tokens in held])[head : head + need]
            head += need - 1
            while held and head >= len(held[0][1]):
                head -= len(held.popleft()[1])
            batches += 1
            # The window's last token starts the next batch, so held is never empty here.
            position = {**held[0][0], "skip": head, "batches": batches}
            windows = np.lib.stride_tricks.sliding_window_view(flat, self.block_size + 1)[:: self.block_size]
            windows = torch.from_numpy(np.ascontiguousarray(windows))  # (B, T + 1)
            yield windows[:, :-1], windows[:, 1:], reader, position

    def _chunks(
        self, reader: int, readers: int, state: ReaderState
    ) -> Iterator[tuple[ReaderState, np.ndarray]]:
        """(position before the chunk, its tokens) for ever, epoch after epoch; raises if a reader gets nothing."""
        from datasets.distributed import split_dataset_by_node

        epoch, hf_state = state["epoch"], state["hf"]
        while True:
            docs = split_dataset_by_node(self.docs, rank=reader, world_size=readers)
            docs.set_epoch(epoch)
            if hf_state is not None:
                docs.load_state_dict(hf_state)
            before = {"epoch": epoch, "hf": hf_state}
            produced = 0
            for batch in docs.iter(batch_size=DOCS_PER_CHUNK):
                texts = [
                    text for text in batch[self.column] if text and document_digest(text) not in self.heldout
                ]
                tokens = document_ids(texts, self.tokenizer)
                after = {"epoch": epoch, "hf": docs.state_dict()}
                if len(tokens):
                    produced += len(tokens)
                    yield before, tokens
                before = after
            if produced == 0 and hf_state is None:
                raise DataConfigError(
                    f"data.num_workers: stream reader {reader} of {readers} (ranks x workers) got no training "
                    "documents; use fewer data.num_workers or a corpus with more documents or files"
                )
            epoch, hf_state = epoch + 1, None


class LoaderPosition:
    """Main-process record of every reader's position after each of its batches, for `state_dict`.

    Batch g of the rank came from reader index g % num_workers (see the module docstring), so between
    start_batch and n trained batches reader index j trained on as many of its own as there are such g in
    [start_batch, n); its saved position is the one it sent with the last.
    """

    def __init__(self, rank: int, num_workers: int, start: dict[int, ReaderState], start_batch: int) -> None:
        self.rank = rank
        self.num_workers = max(1, num_workers)
        self.start_batch = start_batch
        self.readers = [rank * self.num_workers + w for w in range(self.num_workers)]
        self.start = {reader: start.get(reader, fresh_state()) for reader in self.readers}
        self.history: dict[int, deque[ReaderState]] = {reader: deque(maxlen=256) for reader in self.readers}

    def record(self, reader: int, state: ReaderState) -> None:
        self.history[reader].append(state)

    def positions(self, trained_batches: int) -> dict[int, ReaderState]:
        """Each of this rank's readers' position after `trained_batches` (counted like start_batch)."""
        positions = {}
        for index, reader in enumerate(self.readers):
            own = self._turns(trained_batches, index) - self._turns(self.start_batch, index)
            target = self.start[reader]["batches"] + own
            if own == 0:
                positions[reader] = self.start[reader]
                continue
            match = [state for state in self.history[reader] if state["batches"] == target]
            if not match:
                raise RuntimeError(f"stream reader {reader}: no recorded position for its batch {target}")
            positions[reader] = match[-1]
        return positions

    def _turns(self, batches: int, index: int) -> int:
        """How many of the batches 0 .. batches - 1 came from reader index `index` (those with g % n == index)."""
        return max(0, -(-(batches - index) // self.num_workers))
