"""Training and validation batches over a flat token stream.

Training batch i on rank r is a pure function of (seed, i, r) and the stream, so a run resumed at any step draws
exactly the batches the uninterrupted run would have drawn, whatever the number of DataLoader workers.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from common.errors import UserError
from data import DataConfigError

Batch = tuple[torch.Tensor, torch.Tensor]
# A target the loss skips (torch's cross_entropy default): for chat, every token the assistant did not write.
IGNORE_INDEX = -100


def masked_pair(window: np.ndarray, mask: np.ndarray | None) -> Batch:
    """(x, y) of windows (..., T + 1): y is x shifted by one, with IGNORE_INDEX where `mask` (same shape) is 0."""
    window = torch.from_numpy(window.astype(np.int64))
    x, y = window[..., :-1], window[..., 1:]
    if mask is not None:
        y = y.masked_fill(torch.from_numpy(mask[..., 1:] == 0), IGNORE_INDEX)
    return x, y


def worker_slot() -> tuple[int, int]:
    """(this DataLoader worker's id, the number of workers); (0, 1) in the main process."""
    worker = get_worker_info()
    return (worker.id, worker.num_workers) if worker is not None else (0, 1)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """A 63-bit generator seed from (seed, epoch, rank); distinct triples practically never collide."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@lru_cache(maxsize=2)  # a batch that straddles two epochs needs both orders
def epoch_order(seed: int, epoch: int, rank: int, windows: int, max_offset: int) -> tuple[int, torch.Tensor]:
    """One epoch on one rank: where the window grid starts (0..max_offset) and the order its windows are read."""
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch, rank))
    offset = int(torch.randint(0, max_offset + 1, (1,), generator=generator))
    return offset, torch.randperm(windows, generator=generator)


class TokenParts:
    """The token stream's part files read as one array (len, slices, `np.asarray`); pickled as its file names, so
    DataLoader workers map the files themselves."""

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


def _by_path(tokens: np.ndarray) -> np.ndarray | TokenParts:
    """A memory-mapped file goes to DataLoader workers as its path (a TokenParts), never as a copy."""
    if isinstance(tokens, np.memmap) and tokens.filename is not None and tokens.offset == 0:
        if tokens.nbytes == os.path.getsize(tokens.filename):  # the whole file, not a slice of it
            return TokenParts([Path(tokens.filename)], tokens.dtype)
    return tokens


class TrainBatches(IterableDataset):
    """Shuffled (x, y) windows of rank r's contiguous 1/world_size shard of `tokens`, from batch `start_batch`.

    Each epoch reads every window on a randomly shifted grid once, in a random order (a lower validation loss
    than drawing start positions with replacement: docs/results.md). Worker w yields every num_workers-th batch
    and the DataLoader's round-robin puts them back in order.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        num_batches: int | None = None,
        mask: np.ndarray | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.tokens = _by_path(tokens)
        self.mask = mask  # the assistant's tokens (chat), aligned with `tokens`; None: every target counts
        self.block_size, self.batch_size, self.seed, self.rank = block_size, batch_size, seed, rank
        self.start_batch, self.num_batches = start_batch, num_batches
        shard_len = len(tokens) // world_size
        self.shard_start = rank * shard_len
        if shard_len < block_size + 1:
            raise DataConfigError(
                f"data.block_size: each of the {world_size} rank shards of the train stream has {shard_len} "
                f"tokens but block_size={block_size} needs at least {block_size + 1}; lower data.block_size"
            )
        # The grid start can move by up to block_size - 1 and every window still ends inside the shard.
        self.windows_per_epoch = max(1, (shard_len - block_size) // block_size)
        self.max_offset = min(block_size - 1, shard_len - 1 - self.windows_per_epoch * block_size)

    def batch(self, batch_index: int) -> Batch:
        first = batch_index * self.batch_size
        starts = []
        for position in range(first, first + self.batch_size):
            epoch, index = divmod(position, self.windows_per_epoch)
            offset, order = epoch_order(self.seed, epoch, self.rank, self.windows_per_epoch, self.max_offset)
            starts.append(self.shard_start + offset + int(order[index]) * self.block_size)

        def windows(stream: np.ndarray) -> np.ndarray:
            return np.stack([stream[start : start + self.block_size + 1] for start in starts])  # (B, T + 1)

        return masked_pair(windows(self.tokens), None if self.mask is None else windows(self.mask))

    def __iter__(self) -> Iterator[Batch]:
        worker_id, num_workers = worker_slot()
        stop = None if self.num_batches is None else self.start_batch + self.num_batches
        index = self.start_batch + worker_id
        while stop is None or index < stop:
            yield self.batch(index)
            index += num_workers


class ValWindows(Dataset):
    """Consecutive non-overlapping (x, y) windows of the whole stream; the last partial one is dropped."""

    def __init__(self, tokens: np.ndarray, block_size: int, mask: np.ndarray | None = None) -> None:
        self.tokens, self.mask, self.block_size = _by_path(tokens), mask, block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < len(self):
            raise IndexError(index)
        span = slice(index * self.block_size, (index + 1) * self.block_size + 1)
        return masked_pair(self.tokens[span], None if self.mask is None else self.mask[span])


class Loader(DataLoader):
    """Our DataLoader: pinned memory on a GPU machine, workers that leave Ctrl-C and SIGTERM to the main process,
    and their UserErrors keeping their own line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("pin_memory", torch.cuda.is_available())
        kwargs.setdefault("worker_init_fn", leave_stop_signals_to_the_main_process)
        super().__init__(*args, **kwargs)

    def __iter__(self) -> Iterator:
        return _WorkerErrorLines(super().__iter__())


class _WorkerErrorLines:
    """Gives a worker's UserError back its one line: torch re-raises it as "Caught <type> in DataLoader worker
    process <n>." above the worker's traceback, whose last line is the user's."""

    def __init__(self, batches: Iterator) -> None:
        self.batches = batches

    def __iter__(self) -> _WorkerErrorLines:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.batches)
        except UserError as error:
            first, _, rest = str(error).partition("\n")
            if "DataLoader worker" not in first:
                raise
            # "<module>.<Type>: <the line>" ends the worker's traceback
            error.args = (rest.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1],)
            raise error.with_traceback(None) from None

    def __getattr__(self, name: str) -> Any:  # the rest of the DataLoader iterator (its _workers, ...)
        return getattr(self.batches, name)


def leave_stop_signals_to_the_main_process(worker_id: int) -> None:
    """DataLoader workers ignore Ctrl-C and SIGTERM: a terminal sends Ctrl-C to every process of the job, SLURM and
    Kubernetes send SIGTERM to the whole process group, and a worker killed by either ended the run with
    "DataLoader worker ... killed by signal" (inside the save of last.ckpt) instead of the trainer's save at a
    step boundary. The main process still stops them: it ends their loop, and they exit when it does. A SIGTERM
    is only put off, by STOP_GRACE_S: a worker whose iterator was never closed would otherwise keep the
    interpreter's exit waiting on it for ever (multiprocessing terminates its children with SIGTERM)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_later)


STOP_GRACE_S = 60.0  # longer than a step boundary and the save of last.ckpt take


def _exit_later(signum: int, frame: object) -> None:
    timer = threading.Timer(STOP_GRACE_S, os._exit, (0,))
    timer.daemon = True
    timer.start()
