"""Streaming pipeline: tokenize documents on the fly into train.bin / val.bin, never materialising the text.

The tokenizer is trained on the first `tokenizer_train_docs` documents. Without a validation split the
held-out part is the last `val_fraction` of the *tokens* (the character count is unknown until the stream
ends), and the documents the tokenizer saw must lie before it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from data.errors import DataConfigError
from data.segments import segment_documents
from data.token_store import TRAIN_FILE, VAL_FILE, TokenWriter, token_dtype
from data.tokenizer import Tokenizer

_DOCS_PER_BATCH = 256


def tokenize_stream(
    train_docs: Iterable[dict[str, Any]],
    val_docs: Iterable[dict[str, Any]] | None,
    *,
    column: str,
    corpus_key: str,
    tokenizer: Tokenizer | None,
    vocab_size: int,
    val_fraction: float,
    tokenizer_train_docs: int,
    out_dir: Path,
) -> tuple[Tokenizer, str]:
    """Write train.bin and val.bin into `out_dir`; returns the tokenizer and where validation came from."""
    sample_docs = 0
    if tokenizer is None:
        sample = list(islice(_texts(train_docs, column), tokenizer_train_docs))
        if val_docs is None and len(sample) < tokenizer_train_docs:
            raise _leak_error(tokenizer_train_docs, f"the stream has only {len(sample)} documents")
        tokenizer = Tokenizer.train(sample, vocab_size)
        sample_docs = len(sample)
    dtype = token_dtype(tokenizer.vocab_size)
    with TokenWriter(out_dir / TRAIN_FILE, dtype) as writer:
        sample_tokens = write_documents(
            _texts(train_docs, column), tokenizer, writer, mark_after_docs=sample_docs
        )
    if writer.count == 0:
        raise DataConfigError(
            f"{corpus_key}: the corpus has no text in column '{column}'; point it at real text"
        )
    if val_docs is not None:
        with TokenWriter(out_dir / VAL_FILE, dtype) as val_writer:
            write_documents(_texts(val_docs, column), tokenizer, val_writer)
        return tokenizer, "the dataset's validation split"
    hold_out_token_tail(out_dir, dtype, val_fraction, protected_tokens=sample_tokens, sample_docs=sample_docs)
    return tokenizer, f"the last {val_fraction:g} of the train split's tokens"


def write_documents(
    texts: Iterator[str | None], tokenizer: Tokenizer, writer: TokenWriter, mark_after_docs: int = 0
) -> int:
    """Tokenize `texts` into `writer` with a progress bar; returns the token count after `mark_after_docs` docs."""
    docs_done = 0
    mark = 0
    with tqdm(desc=f"Tokenizing {writer.path.name}", unit=" docs") as bar:
        for limit in (mark_after_docs, None):
            while batch := list(islice(texts, _batch_size(docs_done, limit))):
                segments = segment_documents(batch, [docs_done + i == 0 for i in range(len(batch))])
                writer.write(_flat_ids(segments, tokenizer))
                docs_done += len(batch)
                bar.update(len(batch))
            if limit is not None:
                mark = writer.count
    return mark


def hold_out_token_tail(
    out_dir: Path, dtype: np.dtype, val_fraction: float, *, protected_tokens: int, sample_docs: int
) -> None:
    """Move the last `val_fraction` of train.bin's tokens into val.bin (a token-boundary cut, no overlap)."""
    train_path = out_dir / TRAIN_FILE
    tokens = np.memmap(train_path, dtype=dtype, mode="r")
    cut = int(len(tokens) * (1 - val_fraction))
    if protected_tokens > cut:
        raise _leak_error(sample_docs, "they reach into the held-out tail")
    tokens[cut:].tofile(out_dir / VAL_FILE)
    del tokens  # release the mapping before shrinking the file under it
    os.truncate(train_path, cut * dtype.itemsize)


def _batch_size(docs_done: int, limit: int | None) -> int:
    # The first pass stops exactly at `limit` documents so the mark falls on a document boundary.
    return _DOCS_PER_BATCH if limit is None else min(_DOCS_PER_BATCH, max(0, limit - docs_done))


def _flat_ids(segments: dict[str, list], tokenizer: Tokenizer) -> np.ndarray:
    encoded = tokenizer.encode_batch(segments["text"])
    eos = [tokenizer.eos_id]
    pieces = [
        eos + ids if sep else ids for ids, sep in zip(encoded, segments["separator_before"], strict=True)
    ]
    return np.fromiter((i for piece in pieces for i in piece), dtype=np.int64)


def _texts(docs: Iterable[dict[str, Any]], column: str) -> Iterator[str | None]:
    return (row[column] for row in docs)


def _leak_error(sample_docs: int, reason: str) -> DataConfigError:
    return DataConfigError(
        f"data.tokenizer_train_docs: the tokenizer would train on held-out text ({sample_docs} documents; "
        f"{reason}); lower data.tokenizer_train_docs, split documents finer (data.text_sample_by), "
        "or add a validation split"
    )
