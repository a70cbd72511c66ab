"""streaming=True: tokens written on the fly, tokenizer from the first documents, a token-tail hold-out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from data import EOS_TOKEN, DataConfigError, Tokenizer
from data.datamodule import TextDataModule

VOCAB = 300


def _streamed(data_files, cache_dir: Path, **overrides) -> TextDataModule:
    settings = {
        "dataset": "json",
        "data_files": data_files,
        "streaming": True,
        "vocab_size": VOCAB,
        "block_size": 16,
        "cache_dir": str(cache_dir),
        "tokenizer_train_docs": 20,
        **overrides,
    }
    module = TextDataModule(**settings)
    module.setup()
    return module


def test_streamed_tokens_hold_out_the_last_tenth_of_tokens(
    documents: list[str], jsonl_corpus: Path, cache_dir: Path
) -> None:
    module = _streamed(str(jsonl_corpus), cache_dir)
    assert module.tokenizer.sha256 == Tokenizer.train(documents[:20], VOCAB, show_progress=False).sha256
    stream = np.concatenate([module.train_tokens, module.val_tokens])
    assert module.tokenizer.decode(stream.tolist()) == EOS_TOKEN.join(documents)
    assert len(module.train_tokens) == int(len(stream) * 0.9)
    first_docs = EOS_TOKEN.join(documents[:20])
    assert module.tokenizer.decode(module.train_tokens.tolist()).startswith(first_docs), (
        "tokenizer text is train"
    )
    x, y = module.train_batches().batch(0)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert module.meta["val"]["tokens"] == len(module.val_tokens)


def test_streaming_matches_the_materialised_pipeline(
    documents: list[str], jsonl_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    tokenizer_file = tmp_path / "tokenizer.json"
    Tokenizer.train(documents, VOCAB, show_progress=False).save(tokenizer_file)
    files = {"train": str(jsonl_corpus), "validation": str(jsonl_corpus)}
    streamed = _streamed(files, cache_dir, tokenizer_path=str(tokenizer_file))
    materialised = TextDataModule(
        dataset="json",
        data_files=files,
        tokenizer_path=str(tokenizer_file),
        vocab_size=VOCAB,
        block_size=16,
        cache_dir=str(cache_dir),
    )
    materialised.setup()
    assert np.array_equal(streamed.train_tokens, materialised.train_tokens)
    assert np.array_equal(streamed.val_tokens, materialised.val_tokens)
    assert streamed.bytes_per_token == materialised.bytes_per_token


def test_tokenizer_sample_may_not_reach_the_held_out_tail(
    jsonl_corpus: Path, cache_dir: Path, cached_files
) -> None:
    for docs in (1000, 149):  # more documents than the stream has; nearly all of them
        with pytest.raises(DataConfigError, match=r"^data\.tokenizer_train_docs: "):
            _streamed(str(jsonl_corpus), cache_dir, tokenizer_train_docs=docs)
        assert cached_files(cache_dir) == []
