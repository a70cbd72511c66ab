"""Removing the temporary files killed runs left in a run's checkpoint folder, when the next run starts.

A checkpoint folder belongs to one run, so when that run starts every temporary file in it is stale. (The data
cache, shared by runs that may be building right now, is swept by data/ itself: data.store.sweep_data_cache.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from common.files import remove_stale, stale_temp_files


def sweep_stale_files(checkpoint_dir: str | Path, say: Callable[[str], None] = print) -> list[Path]:
    """Remove temporary files in `checkpoint_dir`, with one line saying what went; returns them.

    Call it once when a run starts, on one process (global rank 0), before anything saves.
    """
    stale = stale_temp_files(checkpoint_dir)
    return remove_stale(stale, Path(checkpoint_dir), "temporary checkpoint file", say)
