"""Training batches are a pure function of (seed, batch index, rank); validation windows tile the stream."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from data import DataConfigError
from data.batches import TrainBatches, ValWindows, epoch_seed

N_TOKENS = 10_000
T = 16
B = 8


@pytest.fixture
def positions() -> np.ndarray:
    """Token value == position, so every window shows exactly where it was cut from."""
    return np.arange(N_TOKENS, dtype=np.uint16)


@pytest.fixture
def memmapped_positions(tmp_path: Path, positions: np.ndarray) -> np.memmap:
    positions.tofile(tmp_path / "train.bin")
    return np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")


def _take(batches: TrainBatches, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    iterator = iter(batches)
    return [next(iterator) for _ in range(count)]


def test_windows_are_contiguous_shifted_by_one_and_int64(positions: np.ndarray) -> None:
    for x, y in _take(TrainBatches(positions, T, B, seed=0), 20):
        assert x.shape == y.shape == (B, T)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert torch.equal(y, x + 1), "y[t] is the token after x[t]"
        assert torch.equal(x, x[:, :1] + torch.arange(T)), "each row is one contiguous window"
        assert int(y.max()) < N_TOKENS


def test_resuming_at_batch_k_repeats_the_uninterrupted_run(positions: np.ndarray) -> None:
    uninterrupted = _take(TrainBatches(positions, T, B, seed=7), 12)
    resumed = _take(TrainBatches(positions, T, B, seed=7, start_batch=9), 3)
    for (x_full, y_full), (x_resumed, y_resumed) in zip(uninterrupted[9:], resumed, strict=True):
        assert torch.equal(x_full, x_resumed) and torch.equal(y_full, y_resumed)
    assert not torch.equal(uninterrupted[0][0], uninterrupted[1][0])


def test_seed_changes_the_batches(positions: np.ndarray) -> None:
    a = TrainBatches(positions, T, B, seed=1).batch(0)[0]
    b = TrainBatches(positions, T, B, seed=2).batch(0)[0]
    assert not torch.equal(a, b)


def test_ranks_read_disjoint_contiguous_shards(positions: np.ndarray) -> None:
    world = 3
    seen = []
    for rank in range(world):
        batches = TrainBatches(positions, T, B, seed=0, rank=rank, world_size=world)
        values = torch.cat([torch.cat([x, y], 1) for x, y in _take(batches, 50)])
        shard = N_TOKENS // world
        assert rank * shard <= int(values.min()) and int(values.max()) < (rank + 1) * shard
        seen.append(set(values.flatten().tolist()))
    assert not seen[0] & seen[1] and not seen[1] & seen[2]


def test_epoch_seeds_do_not_collide() -> None:
    seeds = {epoch_seed(seed, epoch, rank) for seed in range(5) for epoch in range(400) for rank in range(8)}
    assert len(seeds) == 5 * 400 * 8
    assert epoch_seed(1, 23, 4) != epoch_seed(12, 3, 4)
    assert all(0 <= s < 2**63 for s in seeds)


def test_an_epoch_reads_every_window_of_the_shard_once(positions: np.ndarray) -> None:
    batches = TrainBatches(positions, T, B, seed=5)
    per_epoch = batches.windows_per_epoch
    assert per_epoch == (N_TOKENS - T) // T
    starts = [int(x[row, 0]) for x, _ in _take(batches, 2 * per_epoch // B + 2) for row in range(B)]
    first, second = starts[:per_epoch], starts[per_epoch : 2 * per_epoch]
    for epoch in (first, second):
        assert len(set(epoch)) == per_epoch, "no window repeats within an epoch"
        assert len({start % T for start in epoch}) == 1, "one grid per epoch"
        assert max(epoch) + T + 1 <= N_TOKENS
    assert first != sorted(first), "the order is shuffled"
    assert first != second, "the next epoch reads another order"


def test_a_shard_of_one_window_still_yields_batches(positions: np.ndarray) -> None:
    batches = TrainBatches(positions[: T + 5], T, batch_size=3, seed=0)
    for x, y in _take(batches, 4):
        assert x.shape == (3, T) and torch.equal(y, x + 1)


def test_workers_keep_the_order_and_receive_a_path_not_a_copy(memmapped_positions: np.memmap) -> None:
    batches = TrainBatches(memmapped_positions, T, B, seed=3, num_batches=6)
    assert len(pickle.dumps(batches)) < 1000, "a memmap must travel to workers as its path"
    in_process = [x for x, _ in DataLoader(batches, batch_size=None, num_workers=0)]
    with_workers = [x for x, _ in DataLoader(batches, batch_size=None, num_workers=2)]
    assert len(in_process) == 6
    assert all(torch.equal(a, b) for a, b in zip(in_process, with_workers, strict=True))


def test_shard_shorter_than_a_window_is_a_config_error(positions: np.ndarray) -> None:
    with pytest.raises(DataConfigError, match="data.block_size"):
        TrainBatches(positions[:40], block_size=16, batch_size=2, seed=0, rank=0, world_size=4)


def test_val_windows_tile_the_stream_without_overlap(positions: np.ndarray) -> None:
    windows = ValWindows(positions[:1000], block_size=T)
    assert len(windows) == (1000 - 1) // T
    for index in range(len(windows)):
        x, y = windows[index]
        assert torch.equal(x, torch.arange(index * T, (index + 1) * T))
        assert torch.equal(y, x + 1)
    xs = torch.cat([x for x, _ in DataLoader(windows, batch_size=B, shuffle=False)])
    assert xs.shape == (len(windows), T)
    assert torch.equal(xs.flatten(), torch.arange(len(windows) * T))


def test_val_windows_need_one_extra_token_for_the_targets(positions: np.ndarray) -> None:
    # Too short a stream for any window is refused earlier, when the token cache is prepared (test_data_errors).
    assert len(ValWindows(positions[:16], block_size=16)) == 0
    assert len(ValWindows(positions[:17], block_size=16)) == 1
