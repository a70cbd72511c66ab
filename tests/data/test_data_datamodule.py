"""TextDataModule end to end, offline: tiny Shakespeare and generated multilingual JSON / parquet corpora."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from data import EOS_TOKEN
from data.datamodule import TextDataModule

VOCAB = 400


@pytest.fixture(scope="module")
def shakespeare_module(shakespeare_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TextDataModule:
    module = TextDataModule(
        data_files=str(shakespeare_path),
        vocab_size=512,
        block_size=64,
        batch_size=4,
        cache_dir=str(tmp_path_factory.mktemp("cache")),
    )
    module.prepare_data()
    module.setup("fit")
    return module


def test_shakespeare_val_is_the_last_tenth_of_the_characters(
    shakespeare_module: TextDataModule, shakespeare_text: str
) -> None:
    cut = int(len(shakespeare_text) * 0.9)
    assert cut == 1_003_854, "the same split point as nanoGPT's shakespeare_char"
    tokenizer = shakespeare_module.tokenizer
    assert tokenizer.decode(shakespeare_module.train_tokens.tolist()) == shakespeare_text[:cut]
    assert tokenizer.decode(shakespeare_module.val_tokens.tolist()) == shakespeare_text[cut:]


def test_shakespeare_arrays_meta_and_bytes_per_token(
    shakespeare_module: TextDataModule, shakespeare_text: str
) -> None:
    module = shakespeare_module
    assert module.train_tokens.dtype == np.uint16 and module.val_tokens.dtype == np.uint16
    assert module.tokenizer.vocab_size == 512 and module.vocab_size == 512 and module.block_size == 64
    val_text = shakespeare_text[int(len(shakespeare_text) * 0.9) :]
    assert module.bytes_per_token == pytest.approx(len(val_text.encode()) / len(module.val_tokens), rel=1e-12)
    assert module.chars_per_token == pytest.approx(len(val_text) / len(module.val_tokens), rel=1e-12)
    assert 1.5 < module.bytes_per_token < 3.0
    meta = json.loads((module.train_tokens.files[0].parent / "meta.json").read_text())
    assert meta["train"]["tokens"] == len(module.train_tokens) and meta["val"]["tokens"] == len(
        module.val_tokens
    )
    assert meta["tokenizer_sha256"] == module.tokenizer.sha256
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 512


def test_shakespeare_batches(shakespeare_module: TextDataModule) -> None:
    x, y = next(iter(shakespeare_module.train_dataloader()))
    assert x.shape == y.shape == (4, 64) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    val_batches = list(shakespeare_module.val_dataloader())
    val_x = torch.cat([vx for vx, _ in val_batches])
    assert len(val_x) == (len(shakespeare_module.val_tokens) - 1) // 64
    assert torch.equal(
        val_x.flatten(), torch.from_numpy(shakespeare_module.val_tokens[: val_x.numel()].astype(np.int64))
    )


def test_train_dataloader_resumes_from_the_attached_trainer(shakespeare_module: TextDataModule) -> None:
    shakespeare_module.trainer = SimpleNamespace(
        global_step=5, accumulate_grad_batches=3, global_rank=1, world_size=2
    )
    try:
        x, _ = next(iter(shakespeare_module.train_dataloader()))
    finally:
        shakespeare_module.trainer = None
    expected, _ = shakespeare_module.train_batches(start_batch=15, rank=1, world_size=2).batch(15)
    assert torch.equal(x, expected)
    half = len(shakespeare_module.train_tokens) // 2
    window_starts = [_find_window(shakespeare_module.train_tokens, row) for row in x.numpy()]
    assert all(half <= start < 2 * half for start in window_starts), "rank 1 reads the second half"


def _find_window(tokens: np.ndarray, row: np.ndarray) -> int:
    starts = np.flatnonzero(tokens[: len(tokens) - len(row) + 1] == row[0])
    return next(int(s) for s in starts if np.array_equal(tokens[s : s + len(row)], row))


def test_json_corpus_split_by_characters_with_separators(
    documents: list[str], jsonl_corpus: Path, cache_dir: Path
) -> None:
    module = TextDataModule(
        dataset="json",
        data_files=str(jsonl_corpus),
        vocab_size=VOCAB,
        block_size=32,
        cache_dir=str(cache_dir),
    )
    module.setup()
    train_text = module.tokenizer.decode(module.train_tokens.tolist())
    val_text = module.tokenizer.decode(module.val_tokens.tolist())
    all_chars = "".join(documents)
    cut = int(len(all_chars) * 0.9)
    assert train_text.replace(EOS_TOKEN, "") == all_chars[:cut]
    assert val_text.replace(EOS_TOKEN, "") == all_chars[cut:]
    assert train_text.count(EOS_TOKEN) + val_text.count(EOS_TOKEN) == len(documents) - 1
    assert train_text.split(EOS_TOKEN)[:5] == documents[:5], "documents joined with one separator between"
    assert module.chars_per_token == pytest.approx(len(all_chars[cut:]) / len(module.val_tokens))
    assert module.bytes_per_token > module.chars_per_token, "emoji and accents take several bytes"
    for x, y in (module.train_batches().batch(i) for i in range(5)):
        assert torch.equal(x[:, 1:], y[:, :-1])


def test_parquet_and_json_give_the_same_tokens(
    documents: list[str], jsonl_corpus: Path, tmp_path: Path, cache_dir: Path
) -> None:
    import datasets

    parquet = tmp_path / "corpus.parquet"
    datasets.Dataset.from_dict({"text": documents}).to_parquet(str(parquet))
    from_json = TextDataModule(
        dataset="json",
        data_files=str(jsonl_corpus),
        vocab_size=VOCAB,
        block_size=32,
        cache_dir=str(cache_dir),
    )
    from_parquet = TextDataModule(
        dataset="parquet",
        data_files=[str(parquet)],
        vocab_size=VOCAB,
        block_size=32,
        cache_dir=str(cache_dir),
    )
    from_json.setup()
    from_parquet.setup()
    assert from_parquet.tokenizer.sha256 == from_json.tokenizer.sha256
    assert np.array_equal(from_parquet.train_tokens, from_json.train_tokens)
    assert np.array_equal(from_parquet.val_tokens, from_json.val_tokens)


def test_own_validation_split_and_custom_column(new_documents, corpus_file, cache_dir: Path) -> None:
    train_docs, val_docs = new_documents(60, seed=1), new_documents(6, seed=2)
    files = {
        "train": str(corpus_file("train.jsonl", train_docs, "body")),
        "validation": str(corpus_file("val.jsonl", val_docs, "body")),
    }
    module = TextDataModule(
        dataset="json",
        data_files=files,
        text_column="body",
        vocab_size=VOCAB,
        block_size=32,
        cache_dir=str(cache_dir),
    )
    module.setup()
    assert module.tokenizer.decode(module.val_tokens.tolist()) == EOS_TOKEN.join(val_docs)
    assert module.tokenizer.decode(module.train_tokens.tolist()) == EOS_TOKEN.join(train_docs)
    assert module.meta["val_source"] == "the dataset's validation split"


def test_every_constructor_argument_is_documented() -> None:
    """LightningCLI shows these docs in --help; a missing one would be an undocumented --data.* key."""
    doc = inspect.getdoc(TextDataModule)
    documented = set(re.findall(r"^    (\w+): ", doc.split("Args:")[1], flags=re.MULTILINE))
    parameters = set(inspect.signature(TextDataModule.__init__).parameters) - {"self"}
    assert documented == parameters


@pytest.mark.parametrize("world_size", [2, 1])
def test_a_multi_process_run_tokenizing_a_large_corpus_names_the_prepare_command(
    corpus_file, new_documents, cache_dir: Path, monkeypatch, capsys, world_size: int
) -> None:
    """Only with other processes waiting, and only above LARGE_BUILD_BYTES (lowered here to 10 KB)."""
    monkeypatch.setattr("data.datamodule.LARGE_BUILD_BYTES", 10_000)
    path = corpus_file("big.jsonl", new_documents(60, seed=9))
    module = TextDataModule(dataset="json", data_files=str(path), vocab_size=300, cache_dir=str(cache_dir))
    module.trainer = SimpleNamespace(local_rank=0, world_size=world_size)
    module.setup("fit")
    hints = [line for line in capsys.readouterr().err.splitlines() if "python -m data.prepare" in line]
    assert len(hints) == (world_size > 1), hints
    module.tokenizer = None
    module.setup("fit")  # the cache is found: nothing left to tokenize, no hint
    assert "python -m data.prepare" not in capsys.readouterr().err


def test_a_waiting_rank_stops_on_this_runs_failure_note_and_not_on_an_older_one(monkeypatch, tmp_path):
    # The note of a run that failed earlier in the same cache must not stop this one; one written by this run's
    # rank 0 (at most 1 s before this process made its data module) must.
    import os

    import data.datamodule as datamodule
    from data import DataConfigError

    module = datamodule.TextDataModule(cache_dir=str(tmp_path))
    note = module._failure_note()
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("the corpus is not UTF-8")
    monkeypatch.setattr(datamodule, "POLL_S", 0.0)
    found = iter([None, None, tmp_path / "built"])
    monkeypatch.setattr(datamodule, "find_data", lambda settings: next(found))
    os.utime(note, (module._created - 1.5,) * 2)  # stale: waits on until rank 0's build appears
    assert module._wait() == tmp_path / "built"
    polls = []

    def not_built(settings):
        polls.append(settings)
        assert len(polls) < 5, "kept waiting past this run's failure note"

    monkeypatch.setattr(datamodule, "find_data", not_built)
    os.utime(note, (module._created - 1.0,) * 2)  # fresh, at the boundary
    with pytest.raises(DataConfigError, match="local rank 0 failed: the corpus is not UTF-8"):
        module._wait()
