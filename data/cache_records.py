"""What a complete data folder's meta.json records of its files (bytes and sha256), and the check of them when the
folder is opened: a truncated, zeroed or missing file is one line naming it and the fix, never trained on."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from data import DataConfigError


def damaged(path: Path, why: str) -> DataConfigError:
    """The one line for a damaged file of a complete folder: the folder is derived data, rebuilt by removing it."""
    return DataConfigError(
        f"{path}: the data cache is damaged ({why}); remove {path.parent} and run again to rebuild it"
    )


def file_records(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Bytes and sha256 of the files `names` of a folder, for meta.json (written after them)."""
    return {
        name: {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)} for name in names
    }


def check_files(folder: Path, meta: dict[str, Any]) -> None:
    """Each file meta.json records is whole: its size, then its sha256 (a zeroed part keeps its size). A folder
    built before the records were kept is trusted as before."""
    for name, record in meta.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            raise damaged(path, "missing")
        if path.stat().st_size != record["bytes"]:
            raise damaged(path, f"{path.stat().st_size} bytes, built with {record['bytes']}")
        if _sha256(path) != record["sha256"]:
            raise damaged(path, "its contents changed since it was built")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
