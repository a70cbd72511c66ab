"""Removing what killed runs left behind: temporary checkpoint files and the data cache's staging folders.

A checkpoint folder belongs to one run, so when that run starts every temporary file in it is stale. The data
cache is shared by runs that may be preparing data right now, so a staging folder is removed only when its
name says it was made on this host by a process that no longer exists.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from common.files import owner_has_exited, stale_temp_files


def _remove(path: Path) -> int:
    """Delete a file or folder; returns the bytes freed (0 if it vanished meanwhile)."""
    try:
        if path.is_dir() and not path.is_symlink():
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
        else:
            size = path.stat().st_size
            path.unlink()
    except FileNotFoundError:
        return 0
    return size


def dead_staging_folders(cache_dir: Path) -> list[Path]:
    """Staging folders under `cache_dir/<corpus>/` whose owner process ran on this host and has exited."""
    if not cache_dir.is_dir():
        return []
    corpora = (p for p in cache_dir.iterdir() if p.is_dir())
    return sorted(temp for corpus in corpora for temp in stale_temp_files(corpus) if owner_has_exited(temp))


def sweep_stale_files(
    checkpoint_dir: str | Path, cache_dir: str | Path | None = None, say: Callable[[str], None] = print
) -> list[Path]:
    """Remove temporary files in `checkpoint_dir` and dead staging folders in `cache_dir`; `say` one line each.

    Call it once when a run starts, on one process (global rank 0), before anything saves.
    """
    removed: list[Path] = []
    groups = [(Path(checkpoint_dir), stale_temp_files(checkpoint_dir), "temporary checkpoint file")]
    if cache_dir is not None:
        groups.append(
            (Path(cache_dir), dead_staging_folders(Path(cache_dir).expanduser()), "data staging folder")
        )
    for folder, stale, what in groups:
        if not stale:
            continue
        freed = sum(_remove(path) for path in stale)
        names = ", ".join(p.name for p in stale[:3]) + (
            f" and {len(stale) - 3} more" if len(stale) > 3 else ""
        )
        say(f"removed {len(stale)} {what}(s) left by killed runs in {folder} ({freed / 1e6:.1f} MB): {names}")
        removed += stale
    return removed
