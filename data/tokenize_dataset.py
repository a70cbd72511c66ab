"""Non-streaming plan: which documents make which token part file, and the tokenizer's bounded training sample.

Without a validation split the hold-out is the last `val_fraction` of the train split's characters (nanoGPT's
`data[int(n * 0.9):]`), cut inside one document. Each split is cut, at document boundaries, into parts of about
`PART_BYTES` of text; the cut depends only on the corpus, so a resumed build (with any `num_proc`) finds the
parts an earlier, killed one finished. data/tokenize_parts.py tokenizes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset

from data.errors import DataConfigError
from data.segments import find_char_cut, segment_batch

PART_BYTES = 64 << 20
# The tokenizer trains on at most this much text, spread evenly over the train documents: enough for stable
# merge statistics at a 32k-50k vocab, small enough to train in a few minutes and bounded memory.
TOKENIZER_SAMPLE_BYTES = 64 << 20
_ROWS_PER_READ = 512


@dataclass(frozen=True)
class Part:
    """Rows [first, stop) of a split's documents; the split starts at row `split_start` of `docs`."""

    name: str
    docs: Dataset
    split_start: int
    first: int
    stop: int
    first_offset: int  # characters dropped from the split's first document
    last_index: int  # split-relative row whose text ends at last_limit characters (-1: none)
    last_limit: int | None
    text_bytes: int

    def chunks(self) -> list[tuple[int, int]]:
        """Row ranges of `_ROWS_PER_READ` documents, the unit read and tokenized at once."""
        return [
            (start, min(self.stop, start + _ROWS_PER_READ))
            for start in range(self.first, self.stop, _ROWS_PER_READ)
        ]

    def segments(self, column: str) -> Iterator[dict[str, list]]:
        """The part's segments, chunk by chunk."""
        for start, stop in self.chunks():
            yield self.read(start, stop, column)

    def read(self, start: int, stop: int, column: str) -> dict[str, list]:
        """Segments of rows [start, stop), clipped at the hold-out cut (see data.segments.segment_batch)."""
        rows = self.docs[start:stop]
        return segment_batch(
            rows,
            [row - self.split_start for row in range(start, stop)],
            column=column,
            first_offset=self.first_offset,
            last_index=self.last_index,
            last_limit=self.last_limit,
        )


@dataclass(frozen=True)
class Plan:
    train: list[Part]
    val: list[Part]
    val_source: str


def plan_parts(
    train_docs: Dataset, val_docs: Dataset | None, column: str, corpus_key: str, val_fraction: float
) -> Plan:
    """Cut both splits into parts; raises a one-line error for a corpus without text or a too-large hold-out."""
    train_docs = train_docs.select_columns([column])
    chars, sizes = document_lengths(train_docs, column)
    if not chars.sum():
        raise DataConfigError(
            f"{corpus_key}: the corpus has no text in column '{column}'; point it at real text"
        )
    if val_docs is not None:
        val_docs = val_docs.select_columns([column])
        _, val_sizes = document_lengths(val_docs, column)
        train = _split_parts("train", train_docs, sizes, None, 0, len(train_docs), 0, -1, None)
        val = _split_parts("val", val_docs, val_sizes, None, 0, len(val_docs), 0, -1, None)
        return Plan(train, val, "the dataset's validation split")
    cut = find_char_cut(chars, val_fraction)
    if cut.row == 0 and cut.offset == 0:
        raise DataConfigError(
            f"data.val_fraction: {val_fraction} holds out all of the text; use a smaller value"
        )
    train = _split_parts("train", train_docs, sizes, chars, 0, cut.row + 1, 0, cut.row, cut.offset)
    val = _split_parts("val", train_docs, sizes, chars, cut.row, len(train_docs), cut.offset, -1, None)
    return Plan(train, val, f"the last {val_fraction:g} of the train split's characters")


def document_lengths(docs: Dataset, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Characters and UTF-8 bytes per document (0 for null), computed in Arrow without Python strings."""
    chars, sizes = [], []
    for table in docs.with_format("arrow").iter(batch_size=10_000):
        chars.append(pc.utf8_length(table[column]).fill_null(0).to_numpy())
        sizes.append(pc.binary_length(table[column]).fill_null(0).to_numpy())
    if not chars:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(chars).astype(np.int64), np.concatenate(sizes).astype(np.int64)


def _split_parts(
    split: str,
    docs: Dataset,
    sizes: np.ndarray,
    chars: np.ndarray | None,
    start: int,
    stop: int,
    first_offset: int,
    last_row: int,
    last_limit: int | None,
) -> list[Part]:
    """Consecutive parts of rows [start, stop) holding about PART_BYTES of text each (at least one row).

    The bounds depend on the whole documents' sizes only (a resumed build finds the same parts); a part's
    `text_bytes` counts the clipped document's share (by characters: exact for ASCII), so a single-document
    corpus such as tiny Shakespeare is not counted twice.
    """
    ends = np.cumsum(sizes[start:stop], dtype=np.int64)
    kept = sizes[start:stop].copy()
    if chars is not None and first_offset:
        kept[0] -= sizes[start] * first_offset // max(1, chars[start])
    if chars is not None and last_limit is not None:
        kept[last_row - start] = sizes[last_row] * last_limit // max(1, chars[last_row])
    kept_ends = np.cumsum(kept, dtype=np.int64)
    bounds = [0]
    while bounds[-1] < len(ends):
        done = int(ends[bounds[-1] - 1]) if bounds[-1] else 0
        bounds.append(max(bounds[-1] + 1, int(np.searchsorted(ends, done + PART_BYTES, side="left")) + 1))
    bounds[-1] = min(bounds[-1], len(ends))
    parts = []
    for index, (first, stop_row) in enumerate(itertools.pairwise(bounds)):
        text = int(kept_ends[stop_row - 1]) - (int(kept_ends[first - 1]) if first else 0)
        parts.append(
            Part(
                name=f"{split}-{index:05d}.bin",
                docs=docs,
                split_start=start,
                first=start + first,
                stop=start + stop_row,
                first_offset=first_offset,
                last_index=last_row - start if last_row >= 0 else -1,
                last_limit=last_limit,
                text_bytes=text,
            )
        )
    return parts


def tokenizer_sample(parts: list[Part], column: str) -> Iterator[list[str]]:
    """At most TOKENIZER_SAMPLE_BYTES of train text: every k-th chunk of documents across the train parts."""
    total = sum(part.text_bytes for part in parts)
    chunk_count = sum(len(part.chunks()) for part in parts)
    stride = max(1, min(chunk_count, -(-total // TOKENIZER_SAMPLE_BYTES)))
    taken = 0
    chunks = [(part, chunk) for part in parts for chunk in part.chunks()]
    for part, (start, stop) in chunks[::stride]:
        segments = part.read(start, stop, column)
        texts = [text[: max(0, TOKENIZER_SAMPLE_BYTES - taken)] for text in segments["text"]]
        taken += sum(len(text.encode("utf-8")) for text in texts)
        yield [text for text in texts if text]
        if taken >= TOKENIZER_SAMPLE_BYTES:
            return
