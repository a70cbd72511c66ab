"""Non-streaming pipeline: documents -> segments -> ids with cached `Dataset.map` -> train.bin / val.bin.

Both maps get an explicit `new_fingerprint`: the segments' from the documents' fingerprint and the cut, the
ids' from the segments' fingerprint and the tokenizer's sha256. So a second run loads both from the `datasets`
cache, and a retrained tokenizer (new sha256) can never pick up ids cached for the old one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value
from tqdm.auto import tqdm

from data.errors import DataConfigError
from data.fingerprint import stable_digest
from data.segments import SEGMENT_CHARS, find_char_cut, segment_batch
from data.token_store import TRAIN_FILE, VAL_FILE, TokenWriter, token_dtype
from data.tokenizer import Tokenizer

_CHARS_PER_PROCESS = 4 << 20  # below this, starting a worker process costs more than it saves
_SEGMENT_FEATURES = Features({"text": Value("string"), "separator_before": Value("bool")})


def tokenize_dataset(
    train_docs: Dataset,
    val_docs: Dataset | None,
    *,
    column: str,
    corpus_key: str,
    tokenizer: Tokenizer | None,
    vocab_size: int,
    val_fraction: float,
    num_proc: int | None,
    out_dir: Path,
) -> tuple[Tokenizer, str]:
    """Write train.bin and val.bin into `out_dir`; train the tokenizer on the train text first if none is given.

    Returns the tokenizer and a description of where validation came from.
    """
    lengths = document_lengths(train_docs, column)
    if not lengths.sum():
        raise DataConfigError(
            f"{corpus_key}: the corpus has no text in column '{column}'; point it at real text"
        )
    procs = resolve_num_proc(num_proc, int(lengths.sum()))
    if val_docs is not None:
        train_segments = segment_split(train_docs, column, num_proc=procs)
        val_segments = segment_split(val_docs, column, num_proc=procs)
        val_source = "the dataset's validation split"
    else:
        train_segments, val_segments = hold_out_char_tail(train_docs, column, lengths, val_fraction, procs)
        val_source = f"the last {val_fraction:g} of the train split's characters"
    if tokenizer is None:
        tokenizer = Tokenizer.train(_text_batches(train_segments), vocab_size, length=len(train_segments))
    for segments, file in ((train_segments, TRAIN_FILE), (val_segments, VAL_FILE)):
        ids = tokenize_segments(segments, tokenizer, num_proc=procs, desc=f"Tokenizing {file}")
        write_ids(ids, out_dir / file, token_dtype(tokenizer.vocab_size))
    return tokenizer, val_source


def hold_out_char_tail(
    docs: Dataset, column: str, lengths: np.ndarray, val_fraction: float, num_proc: int
) -> tuple[Dataset, Dataset]:
    """Segments of the first 1 - val_fraction of the characters and of the rest, cut inside one document."""
    cut = find_char_cut(lengths, val_fraction)
    if cut.row == 0 and cut.offset == 0:
        raise DataConfigError(
            f"data.val_fraction: {val_fraction} holds out all of the text; use a smaller value"
        )
    train = segment_split(
        docs.select(range(cut.row + 1)), column, num_proc=num_proc, last_index=cut.row, last_limit=cut.offset
    )
    val = segment_split(
        docs.select(range(cut.row, len(docs))), column, num_proc=num_proc, first_offset=cut.offset
    )
    return train, val


def document_lengths(docs: Dataset, column: str) -> np.ndarray:
    """Characters per document (0 for null), computed in Arrow without Python strings."""
    counts = [
        pc.utf8_length(table[column]).fill_null(0).to_numpy()
        for table in docs.with_format("arrow").iter(batch_size=10_000)
    ]
    return np.concatenate(counts).astype(np.int64) if counts else np.zeros(0, dtype=np.int64)


def resolve_num_proc(requested: int | None, total_chars: int) -> int:
    """`requested`, or for None one process per ~4 MB of text, up to min(8, CPUs)."""
    if requested is not None:
        return max(1, requested)
    return max(1, min(8, os.cpu_count() or 1, total_chars // _CHARS_PER_PROCESS))


def segment_split(
    docs: Dataset,
    column: str,
    *,
    num_proc: int = 1,
    first_offset: int = 0,
    last_index: int = -1,
    last_limit: int | None = None,
) -> Dataset:
    """Segments of `docs` (see `segment_batch` for the clipping), cached by `datasets`."""
    fn_kwargs = {
        "column": column,
        "first_offset": first_offset,
        "last_index": last_index,
        "last_limit": last_limit,
        "max_chars": SEGMENT_CHARS,
    }
    return docs.map(
        segment_batch,
        batched=True,
        with_indices=True,
        fn_kwargs=fn_kwargs,
        remove_columns=docs.column_names,
        features=_SEGMENT_FEATURES,
        num_proc=_procs_for(docs, num_proc),
        desc="Segmenting documents",
        new_fingerprint=stable_digest(docs._fingerprint, "segments", fn_kwargs),
    )


def tokenize_segments(
    segments: Dataset, tokenizer: Tokenizer, *, num_proc: int = 1, desc: str = "Tokenizing"
) -> Dataset:
    """One `ids` row per segment, `<|endoftext|>` first where a document starts; cached per tokenizer sha256."""
    procs = _procs_for(segments, num_proc)
    features = Features({"ids": List(Value(token_dtype(tokenizer.vocab_size).name))})
    with _tokenizer_threads_off_in_workers(procs):
        return segments.map(
            encode_segments,
            batched=True,
            fn_kwargs={"tokenizer": tokenizer},
            remove_columns=segments.column_names,
            features=features,
            num_proc=procs,
            desc=desc,
            new_fingerprint=stable_digest(segments._fingerprint, "ids", tokenizer.sha256),
        )


def encode_segments(batch: dict[str, list], tokenizer: Tokenizer) -> dict[str, list[list[int]]]:
    """`Dataset.map` function: ids of each segment, with the separator where a new document starts."""
    eos = tokenizer.eos_id
    encoded = tokenizer.encode_batch(batch["text"])
    return {
        "ids": [
            [eos, *ids] if sep else ids for ids, sep in zip(encoded, batch["separator_before"], strict=True)
        ]
    }


def write_ids(ids: Dataset, path: Path, dtype: np.dtype) -> int:
    """Concatenate the `ids` rows into one flat file; returns the number of tokens."""
    with (
        TokenWriter(path, dtype) as writer,
        tqdm(total=len(ids), desc=f"Writing {path.name}", unit=" rows") as bar,
    ):
        for table in ids.with_format("arrow").iter(batch_size=4096):
            writer.write(pc.list_flatten(table["ids"]).to_numpy())
            bar.update(table.num_rows)
    return writer.count


def _text_batches(segments: Dataset) -> Iterator[list[str]]:
    for batch in segments.iter(batch_size=1000):
        yield batch["text"]


def _procs_for(dataset: Dataset, num_proc: int) -> int | None:
    # datasets warns and clamps when there are fewer rows than processes; None skips the process pool.
    procs = min(num_proc, len(dataset))
    return procs if procs > 1 else None


@contextmanager
def _tokenizer_threads_off_in_workers(num_proc: int | None) -> Iterator[None]:
    """Forked map workers each run one tokenizer thread: the processes already use the cores, and the Rust
    thread pool would otherwise warn (and disable itself) after a fork."""
    if num_proc is None or "TOKENIZERS_PARALLELISM" in os.environ:
        yield
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        del os.environ["TOKENIZERS_PARALLELISM"]
