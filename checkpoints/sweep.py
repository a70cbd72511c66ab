"""Removing what killed runs left behind when a run starts: temporary checkpoint files, then (through data/)
the data cache's dead staging folders.

A checkpoint folder belongs to one run, so when that run starts every temporary file in it is stale. The data
cache is shared by runs that may be preparing data right now; data.cache_sweep decides what is dead there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from common.files import remove_stale, stale_temp_files
from data.cache_sweep import sweep_data_cache


def sweep_stale_files(
    checkpoint_dir: str | Path, cache_dir: str | Path | None = None, say: Callable[[str], None] = print
) -> list[Path]:
    """Remove temporary files in `checkpoint_dir` and dead staging folders in `cache_dir`; `say` one line each.

    Call it once when a run starts, on one process (global rank 0), before anything saves.
    """
    stale = stale_temp_files(checkpoint_dir)
    removed = remove_stale(stale, Path(checkpoint_dir), "temporary checkpoint file", say)
    if cache_dir is not None:
        removed += sweep_data_cache(Path(cache_dir), say)
    return removed
