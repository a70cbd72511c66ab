"""The one timing rule of the speed benchmarks: alternate the sides within every round, and take medians.
On a shared machine, alternating spreads a load spike over all sides alike; the median ignores the odd slow round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)
Measure = float | tuple[float, ...]


def alternate_medians(runs: Mapping[Key, Callable[[], Measure]], repeats: int) -> dict[Key, Measure]:
    """The median of what each run returns (a number, or a tuple of them, each its own median), over `repeats`
    rounds after one uncounted warm-up round (thread pools, kernels, compiles)."""
    for run in runs.values():
        run()
    values: dict[Key, list[Measure]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            values[name].append(run())
    return {name: _median(measured) for name, measured in values.items()}


def wall_seconds(
    fn: Callable[[], object], outputs: dict | None = None, key: Hashable = None
) -> Callable[[], float]:
    """A run for `alternate_medians` that measures fn's wall time, keeping its latest result in outputs[key]."""

    def run() -> float:
        synchronize()
        start = time.perf_counter()
        result = fn()
        synchronize()
        if outputs is not None:
            outputs[key] = result
        return time.perf_counter() - start

    return run


def synchronize() -> None:
    """Wait for queued CUDA work, so that a clock read after it counts it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median(measured: list[Measure]) -> Measure:
    if isinstance(measured[0], tuple):
        return tuple(statistics.median(column) for column in zip(*measured, strict=True))
    return statistics.median(measured)
