"""The data cache's own clean-up: staging folders that a killed preparation left under `<cache_dir>/<corpus>/`.

The cache is shared by runs that may be preparing data right now, so a staging folder is removed only when its
name says it was made on this host by a process that no longer exists (common.files names its owner).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from common.files import owner_has_exited, remove_stale, stale_temp_files


def dead_staging_folders(cache_dir: Path) -> list[Path]:
    """Staging folders under `cache_dir/<corpus>/` whose owner process ran on this host and has exited."""
    if not cache_dir.is_dir():
        return []
    corpora = (p for p in cache_dir.iterdir() if p.is_dir())
    return sorted(temp for corpus in corpora for temp in stale_temp_files(corpus) if owner_has_exited(temp))


def sweep_data_cache(cache_dir: Path, say: Callable[[str], None] = print) -> list[Path]:
    """Remove the dead staging folders of `cache_dir`, with one line saying what went; returns them."""
    return remove_stale(dead_staging_folders(cache_dir.expanduser()), cache_dir, "data staging folder", say)
