"""Where the text comes from: a `datasets` builder with files, or a Hub id; loading with one-line errors."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common.errors import first_line
from data import DataConfigError

BUILDERS = ("text", "json", "parquet", "csv", "arrow")
VALIDATION_SPLITS = ("validation", "valid")
# Relative to the repository root, as a user types it on the command line.
SHIPPED_CORPUS = "data/corpora/tinyshakespeare.txt"
DataFiles = str | list[str] | dict[str, str | list[str]]
SampleBy = Literal["document", "paragraph", "line"]


def is_remote(file: str) -> bool:
    """URLs (https://, hf://, s3://) are fetched by `datasets`; anything else is a local path or glob."""
    return "://" in file


def offline_reason() -> str | None:
    """Why downloads are disabled (e.g. "HF_HUB_OFFLINE=1"), or None when online."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{name}=1"
    import datasets.config

    return "datasets offline mode" if datasets.config.HF_HUB_OFFLINE else None


@dataclass(frozen=True)
class CorpusSource:
    """A corpus as `datasets.load_dataset` sees it; `check` does the cheap validation, `load` the real work."""

    dataset: str = "text"
    dataset_config: str | None = None
    data_files: DataFiles | None = None
    revision: str | None = None
    text_column: str = "text"
    text_sample_by: SampleBy = "document"
    streaming: bool = False
    chat_column: str | None = None  # conversations instead of text (data/documents.py)

    @property
    def column(self) -> str:
        return self.chat_column or self.text_column

    @property
    def uses_builder(self) -> bool:
        """True for a packaged builder (text/json/...) reading `data_files`; False for a Hub id or folder."""
        return self.dataset in BUILDERS

    @property
    def builder_files(self) -> DataFiles | None:
        """`data_files` for a builder; None for a Hub id, which names its own files (the default is ignored)."""
        return self.data_files if self.uses_builder else None

    @property
    def key(self) -> str:  # the config key to blame when the corpus itself is unusable
        return "data.data_files" if self.uses_builder else "data.dataset"

    def files(self) -> list[str]:
        """Every data file: local paths, globs and folders resolved to the files they name; URLs as given."""
        return _flatten(_map_files(self.builder_files, lambda file: _absolute(file, expand=True)))

    def check(self) -> None:
        """Fail fast, before any loading, on a builder without files and on local files that do not exist."""
        if self.uses_builder and not self.builder_files:
            raise DataConfigError(
                f"data.data_files: the '{self.dataset}' builder needs data files; pass a local path or URL"
            )
        if self.chat_column and self.dataset == "text":
            raise DataConfigError(
                "data.dataset: conversations (data.chat_column) are rows of JSON lines or a Hub dataset, not "
                "plain text; set data.dataset json"
            )
        files = self.files()
        local = [path for path in files if not is_remote(path)]
        json_files = [path for path in local if path.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz"))]
        if self.dataset == "text" and json_files:
            raise DataConfigError(
                f"data.dataset: {json_files[0]} is JSON but data.dataset is 'text', which would train on the raw "
                "JSON lines; pass --data.dataset json (and --data.text_column if the text is not in 'text')"
            )
        if local and len(local) == len(files) and not any(os.path.getsize(path) for path in local):
            raise DataConfigError(f"data.data_files: {local[0]} is empty; point it at a file with text")

    def resolved_data_files(self) -> DataFiles | None:
        """`data_files` with local paths made absolute (globs kept), so the cache key ignores the cwd."""
        return _map_files(self.builder_files, _absolute)

    def identity(self) -> dict[str, Any]:
        """Everything that decides the documents: the cache key. Local files count by path, size and mtime."""
        files = [_file_identity(path) for path in self.files()]
        if not self.uses_builder and Path(self.dataset).is_dir():
            files += [
                _file_identity(str(path)) for path in sorted(Path(self.dataset).rglob("*")) if path.is_file()
            ]
        return {
            "dataset": self.dataset,
            "dataset_config": self.dataset_config,
            "data_files": self.resolved_data_files(),
            "files": files,
            "revision": self.revision,
            "text_column": self.text_column,
            "text_sample_by": self.text_sample_by if self.dataset == "text" else None,
            "streaming": self.streaming,
            # A chat cache holds masks: never reused for text, nor back (text caches keep their old keys).
            **({"chat_column": self.chat_column} if self.chat_column else {}),
        }

    def load(self) -> tuple[Any, Any | None]:
        """(train, validation or None) as `Dataset`s, or `IterableDataset`s when streaming."""
        import datasets

        kwargs: dict[str, Any] = {}
        if self.uses_builder:
            kwargs["data_files"] = self.resolved_data_files()
        if self.dataset == "text":
            kwargs.update(sample_by=self.text_sample_by, keep_linebreaks=True)
        try:
            splits = datasets.load_dataset(
                self.dataset, self.dataset_config, revision=self.revision, streaming=self.streaming, **kwargs
            )
            return self._pick_splits(splits)  # a stream reads its first rows here
        except DataConfigError:
            raise
        except Exception as error:  # datasets raises many types; the user needs the key and the fix
            raise self._load_error(error) from error

    def documents(self, docs: Any) -> Iterator[Any]:
        """The text (or conversation) of each row of `docs`; a stream finds a file that is not UTF-8 only here,
        as it reads it."""
        try:
            for row in docs:
                yield row[self.column]
        except UnicodeDecodeError as error:
            raise self._load_error(error) from None

    def _pick_splits(self, splits: Any) -> tuple[Any, Any | None]:
        names = list(splits.keys())
        if "train" not in names:
            raise DataConfigError(f"{self.key}: the corpus has no 'train' split (found {names}); add one")
        validation = next((splits[name] for name in VALIDATION_SPLITS if name in names), None)
        for split in (splits["train"], validation):
            if split is not None:
                self._check_column(split)
        return splits["train"], validation

    def _check_column(self, split: Any) -> None:
        columns = split.column_names
        if columns is None:  # a streamed json/csv split only knows its columns after the first row
            columns = list(next(iter(split), {}).keys())
        if not columns:
            raise DataConfigError(f"{self.key}: the corpus is empty (no rows); point it at a file with text")
        key = "data.chat_column" if self.chat_column else "data.text_column"
        if self.column not in columns:
            raise DataConfigError(
                f"{key}: no column '{self.column}' in the corpus; set {key} to one of {columns}"
            )

    def _load_error(self, error: Exception) -> DataConfigError:
        cause: BaseException | None = error  # datasets wraps what its builders raise
        while cause is not None and not isinstance(cause, UnicodeDecodeError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            bad = next((path for path in self.files() if not _is_utf8(path)), "a data file")
            return DataConfigError(
                f"data.data_files: {bad} is not UTF-8 text; convert it (iconv -t UTF-8) or point at a text file"
            )
        offline = offline_reason()
        remote = [file for file in _flatten(self.builder_files) if is_remote(file)]
        if offline and not self.uses_builder:
            return DataConfigError(
                f"data.dataset: cannot load Hub dataset '{self.dataset}' offline ({offline}); "
                "set data.dataset=text and data.data_files to a local file"
            )
        if offline and remote:
            return DataConfigError(
                f"data.data_files: cannot download {remote[0]} offline ({offline}); "
                "set data.data_files to a local copy of the file"
            )
        if remote and (isinstance(error, FileNotFoundError) or _is_network_error(error)):
            return DataConfigError(
                f"data.data_files: could not download {remote[0]}; the network is the likely cause (or a wrong URL): "
                f"set data.data_files to a local copy, e.g. {SHIPPED_CORPUS}"
            )
        if isinstance(error, FileNotFoundError) and self.uses_builder:
            return DataConfigError(f"data.data_files: {first_line(error)}; pass an existing file or URL")
        if not self.uses_builder and _is_network_error(error):
            return DataConfigError(
                f"data.dataset: could not reach the Hugging Face Hub for '{self.dataset}'; the network is the likely "
                f"cause (or a wrong id): train from a local file with data.dataset=text data.data_files={SHIPPED_CORPUS}"
            )
        return DataConfigError(
            f"{self.key}: cannot load '{self.dataset}': {type(error).__name__}: {first_line(error)}"
        )


def _is_utf8(path: str) -> bool:
    """Whether a local file decodes as UTF-8 (read in 1 MB pieces; only on the error path). URLs count as text."""
    if is_remote(path):
        return True
    try:
        with open(path, encoding="utf-8") as file:
            while file.read(1 << 20):
                pass
    except UnicodeDecodeError:
        return False
    return True


def _is_network_error(error: BaseException) -> bool:
    """True for the connection errors of Python, requests and httpx (which share no base class)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return isinstance(error, (ConnectionError, TimeoutError)) or bool(
        names & {"ConnectError", "Timeout", "TimeoutException"}
    )


def _flatten(data_files: DataFiles | None) -> list[str]:
    if isinstance(data_files, dict):
        return [file for files in data_files.values() for file in _flatten(files)]
    return [data_files] if isinstance(data_files, str) else list(data_files or [])


def _map_files(files: DataFiles | None, function: Any) -> Any:
    """`function` over each file of `data_files`, keeping its shape (one, a list, a dict of splits); a list it
    returns (a folder's files) is flattened into the list."""
    if files is None or isinstance(files, str):
        return None if files is None else function(files)
    if isinstance(files, dict):
        return {split: _map_files(split_files, function) for split, split_files in files.items()}
    return [file for item in map(function, files) for file in (item if isinstance(item, list) else [item])]


def _absolute(file: str, expand: bool = False) -> str | list[str]:
    """A local path or glob made absolute (a folder: its files, hidden ones skipped); a URL as given. With
    `expand`, a glob's matches, which must exist."""
    if is_remote(file):
        return file
    path = Path(file).expanduser().resolve()
    if path.is_dir():
        found = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not found:
            raise DataConfigError(
                f"data.data_files: the folder {path} holds no files; put the corpus files in it"
            )
        return found
    name = str(path)
    if not expand:
        return name
    found = sorted(glob.glob(name)) if glob.has_magic(name) else [name] if path.is_file() else []
    if not found:
        raise DataConfigError(f"data.data_files: {file} does not exist; pass an existing file or URL")
    return found


def _file_identity(file: str) -> list[Any]:
    if is_remote(file):
        return [file]
    stat = os.stat(file)
    return [file, stat.st_size, stat.st_mtime_ns]
