"""Shared fixtures for the data tests: tiny Shakespeare excerpts and a generated multilingual corpus.

The offline environment (Hugging Face caches in a temporary folder) is set once, in tests/conftest.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

_WORDS = [
    "the",
    "and",
    "king",
    "naïve",
    "café",
    "Straße",
    "日本語",
    "😀",
    "🎉👍🏽",
    "Ελληνικά",
    "Привет",
    "mañana",
    "e\u0301",
    "'s",
    "it's",
    "42",
    "3.14",
    "—",
    "«quote»",
    "\t",
    "  ",
    "\r\n",
    "\n",
    "\n\n",
    "x\ny",
]


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_path: Path) -> str:
    return shakespeare_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def shakespeare_excerpt(shakespeare_text: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 100 000 characters as a file: enough to train a small vocab, quick to tokenize."""
    path = tmp_path_factory.mktemp("excerpt") / "shakespeare_excerpt.txt"
    path.write_text(shakespeare_text[:100_000], encoding="utf-8")
    return path


def make_documents(count: int, seed: int, words_per_doc: int = 120) -> list[str]:
    """Deterministic multilingual documents with emoji, combining marks, tabs and Windows newlines."""
    rng = random.Random(seed)
    return [
        "".join(
            rng.choice(_WORDS) + rng.choice(" ,.\n")
            for _ in range(rng.randint(words_per_doc // 2, words_per_doc))
        )
        for _ in range(count)
    ]


def write_jsonl(path: Path, documents: list[str], column: str = "text") -> Path:
    lines = [json.dumps({column: doc, "id": i}, ensure_ascii=False) + "\n" for i, doc in enumerate(documents)]
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def documents() -> list[str]:
    """150 generated documents (~60 KB)."""
    return make_documents(150, seed=0)


@pytest.fixture(scope="session")
def jsonl_corpus(documents: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`documents` as a JSON-lines file with a `text` and an `id` column."""
    return write_jsonl(tmp_path_factory.mktemp("jsonl") / "corpus.jsonl", documents)


@pytest.fixture
def corpus_file(tmp_path: Path):
    """Factory: write documents as JSON lines under this test's tmp dir; returns the path."""

    def write(name: str, documents: list[str], column: str = "text") -> Path:
        return write_jsonl(tmp_path / name, documents, column)

    return write


@pytest.fixture(scope="session")
def new_documents():
    """Factory: `make_documents(count, seed)` for tests that need their own corpus (a pure function, so any
    fixture scope may use it)."""
    return make_documents


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def files_under(folder: Path) -> list[Path]:
    """Every file under `folder`: after a failed run there must be none a later run could trust."""
    return sorted(path for path in folder.rglob("*") if path.is_file()) if folder.exists() else []


@pytest.fixture
def cached_files():
    """`cached_files(folder)`: every file under a cache folder."""
    return files_under
