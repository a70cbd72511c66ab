"""The token cache: a second run does no work, a new tokenizer or changed file never reuses stale ids, and a
failed run leaves nothing a later run would trust."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np
import pytest

from common.files import StagedFolder
from data import Tokenizer
from data.datamodule import TextDataModule
from data.token_store import META_FILE, publish_token_folder
from data.tokenize_dataset import segment_split, tokenize_segments

VOCAB = 300


def _module(data_files: Path, cache_dir: Path, **overrides) -> TextDataModule:
    settings = {
        "dataset": "json",
        "data_files": str(data_files),
        "vocab_size": VOCAB,
        "block_size": 16,
        "cache_dir": str(cache_dir),
        **overrides,
    }
    module = TextDataModule(**settings)
    module.setup()
    return module


@pytest.fixture
def count_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every datasets.load_dataset call."""
    calls: list[str] = []
    real_load = datasets.load_dataset

    def counting_load(path: str, *args, **kwargs):
        calls.append(path)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", counting_load)
    return calls


def test_second_run_does_no_work(jsonl_corpus: Path, cache_dir: Path, count_loads: list[str]) -> None:
    first = _module(jsonl_corpus, cache_dir)
    meta = first.train_tokens.files[0].parent / META_FILE
    stamp = meta.stat().st_mtime_ns
    assert count_loads == ["json"]
    second = _module(jsonl_corpus, cache_dir)
    assert count_loads == ["json"], "a cache hit must not even load the dataset"
    assert meta.stat().st_mtime_ns == stamp
    assert np.array_equal(first.train_tokens, second.train_tokens)
    assert second.tokenizer.sha256 == first.tokenizer.sha256


def test_retrained_tokenizer_at_the_same_path_never_reuses_ids(
    jsonl_corpus: Path, documents: list[str], cache_dir: Path, tmp_path: Path
) -> None:
    tokenizer_file = tmp_path / "tokenizer.json"
    Tokenizer.train(documents, 300, show_progress=False).save(tokenizer_file)
    before = _module(jsonl_corpus, cache_dir, tokenizer_path=str(tokenizer_file), vocab_size=512)
    retrained = Tokenizer.train(documents, 450, show_progress=False)
    retrained.save(tokenizer_file)  # same path and same config: only the file's content changed
    after = _module(jsonl_corpus, cache_dir, tokenizer_path=str(tokenizer_file), vocab_size=512)
    assert after.tokenizer.sha256 == retrained.sha256 != before.tokenizer.sha256
    assert len(after.train_tokens) < len(before.train_tokens), "more merges, fewer tokens"
    assert after.train_tokens[:200].tolist() == retrained.encode(documents[0])[:200]
    assert after.tokenizer.decode(after.train_tokens.tolist()) == before.tokenizer.decode(
        before.train_tokens.tolist()
    )


def test_a_different_vocab_size_trains_a_new_tokenizer(jsonl_corpus: Path, cache_dir: Path) -> None:
    small = _module(jsonl_corpus, cache_dir, vocab_size=300)
    large = _module(jsonl_corpus, cache_dir, vocab_size=400)
    assert small.tokenizer.vocab_size == 300 and large.tokenizer.vocab_size == 400
    assert len(large.train_tokens) < len(small.train_tokens)


def test_editing_the_data_file_invalidates_the_cache(new_documents, corpus_file, cache_dir: Path) -> None:
    path = corpus_file("corpus.jsonl", new_documents(40, seed=5))
    before = _module(path, cache_dir)
    edited = new_documents(40, seed=6)
    corpus_file("corpus.jsonl", edited)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    after = _module(path, cache_dir)
    assert after.tokenizer.decode(after.train_tokens.tolist()).startswith(edited[0])
    assert not np.array_equal(before.train_tokens[:100], after.train_tokens[:100])


def test_map_cache_is_keyed_on_the_tokenizer_hash(
    new_documents, corpus_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dataset.map itself: the same tokenizer loads the cached ids, a different one recomputes them."""
    documents = new_documents(80, seed=11)  # a corpus no other test has mapped
    docs = datasets.load_dataset("json", data_files=str(corpus_file("fresh.jsonl", documents)), split="train")
    segments = segment_split(docs, "text")
    first_tokenizer = Tokenizer.train(documents, 300, show_progress=False)
    second_tokenizer = Tokenizer.train(documents, 380, show_progress=False)
    encoded_batches = []
    real_encode = Tokenizer.encode_batch
    monkeypatch.setattr(
        Tokenizer,
        "encode_batch",
        lambda self, texts: encoded_batches.append(len(texts)) or real_encode(self, texts),
    )

    first = tokenize_segments(segments, first_tokenizer)
    assert encoded_batches, "the first run tokenizes"
    encoded_batches.clear()
    again = tokenize_segments(segments, first_tokenizer)
    assert encoded_batches == [], "the second run loads the cached ids"
    assert again.cache_files == first.cache_files
    second = tokenize_segments(segments, second_tokenizer)
    assert encoded_batches, "a new tokenizer recomputes"
    assert second.cache_files != first.cache_files
    assert second[0]["ids"] == second_tokenizer.encode(documents[0]) != first[0]["ids"]


def test_two_map_processes_give_the_same_ids_in_order(new_documents, corpus_file) -> None:
    documents = new_documents(40, seed=12)
    docs = datasets.load_dataset(
        "json", data_files=str(corpus_file("parallel.jsonl", documents)), split="train"
    )
    segments = segment_split(docs, "text", num_proc=2)
    tokenizer = Tokenizer.train(documents, 300, show_progress=False)
    parallel = tokenize_segments(segments, tokenizer, num_proc=2)
    assert len(parallel.cache_files) == 2, "one Arrow file per worker process"
    single = tokenize_segments(segments, tokenizer, num_proc=1)
    assert parallel["ids"] == single["ids"]
    flat = [i for ids in parallel["ids"] for i in ids]
    assert tokenizer.decode(flat) == "<|endoftext|>".join(documents)


def test_a_failed_run_leaves_nothing_to_trust(
    jsonl_corpus: Path, cache_dir: Path, cached_files, monkeypatch: pytest.MonkeyPatch
) -> None:
    import data.tokenize_dataset

    real_write = data.tokenize_dataset.write_ids
    calls = []

    def crash_on_val(ids, path, dtype):
        calls.append(path.name)
        real_write(ids, path, dtype)  # train.bin is written in full, then the run dies
        if path.name == "val.bin":
            raise KeyboardInterrupt

    monkeypatch.setattr(data.tokenize_dataset, "write_ids", crash_on_val)
    with pytest.raises(KeyboardInterrupt):
        _module(jsonl_corpus, cache_dir)
    assert calls == ["train.bin", "val.bin"]
    assert cached_files(cache_dir) == []
    monkeypatch.undo()
    module = _module(jsonl_corpus, cache_dir)
    assert len(module.val_tokens) > 0


def test_publish_keeps_a_folder_another_process_published_first(tmp_path: Path) -> None:
    winner = tmp_path / "tokens-x"
    winner.mkdir()
    (winner / META_FILE).write_text("{}")
    with StagedFolder(tmp_path) as staged:
        (staged.path / META_FILE).write_text('{"loser": true}')
        assert publish_token_folder(staged, "tokens-x") == winner
    assert (winner / META_FILE).read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens-x"]
