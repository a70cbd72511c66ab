"""What streaming needs before step 1: the tokenizer and the held-out validation documents, tokenized once.

One sequential pass over the head of the stream (no sharding): without a validation split, the first
`val_docs` documents are held out (their digests go to heldout.json, and every training reader skips them),
and the tokenizer trains on the next `tokenizer_train_docs` documents, so it never sees validation text. With a
validation split, its first `val_docs` documents are the validation set and the tokenizer trains on the first
`tokenizer_train_docs` training documents. The training text itself is tokenized later, in the loader.
"""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from data.errors import DataConfigError
from data.stream_batches import document_digest, document_ids
from data.token_store import META_FILE, TOKENIZER_FILE, VAL_FILE, stream_stats, token_dtype
from data.tokenizer import Tokenizer

HELDOUT_FILE = "heldout.json"
_DOCS_PER_BATCH = 256


def build_stream_folder(
    train_docs: Any,
    val_docs: Any | None,
    *,
    column: str,
    corpus_key: str,
    tokenizer: Tokenizer | None,
    vocab_size: int,
    held_out_docs: int,
    tokenizer_train_docs: int,
    out_dir: Path,
) -> Tokenizer:
    """Write val.bin, heldout.json, tokenizer.json and (last) meta.json into `out_dir`."""
    head = _texts(train_docs, column)
    if val_docs is None:
        validation = list(islice(head, held_out_docs))
        heldout = sorted({document_digest(text) for text in validation if text})
        source = f"the first {len(validation)} documents of the train split (left out of training)"
    else:
        validation = list(islice(_texts(val_docs, column), held_out_docs))
        heldout = []
        source = f"the first {len(validation)} documents of the validation split"
    if not any(validation):
        raise DataConfigError(
            f"{corpus_key}: the corpus has no text in column '{column}'; point it at real text"
        )
    if tokenizer is None:
        sample = [text for text in islice(head, tokenizer_train_docs) if text]
        if not sample:
            raise DataConfigError(
                f"data.val_docs: holding out {held_out_docs} documents leaves none to train the tokenizer or "
                "the model on; lower data.val_docs or add a validation split"
            )
        tokenizer = Tokenizer.train(sample, vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    val = np.concatenate(
        [
            document_ids(validation[start : start + _DOCS_PER_BATCH], tokenizer)
            for start in range(0, len(validation), _DOCS_PER_BATCH)
        ]
    ).astype(dtype)
    val.tofile(out_dir / VAL_FILE)
    (out_dir / HELDOUT_FILE).write_text(json.dumps(heldout), encoding="utf-8")
    tokenizer.save(out_dir / TOKENIZER_FILE)
    stats = stream_stats(val, tokenizer.token_bytes())
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "eos_id": tokenizer.eos_id,
        "tokenizer_sha256": tokenizer.sha256,
        "val": stats,
        "val_source": source,
        "bytes_per_token": stats["bytes"] / max(1, stats["tokens"]),
        "chars_per_token": stats["chars"] / max(1, stats["tokens"]),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return tokenizer


def read_heldout(folder: Path) -> frozenset[str]:
    return frozenset(json.loads((folder / HELDOUT_FILE).read_text(encoding="utf-8")))


def _texts(docs: Any, column: str):
    return (row[column] for row in docs)
