"""Documents -> segments that tokenize exactly like the whole document, and the held-out character cut.

Long documents (tiny Shakespeare is one 1 MB document) are cut into segments of a few KB so tokenization runs
in parallel and in bounded memory. A cut is only made after a lone newline that sits between two non-space
characters: the byte-level pre-tokenizer always ends a piece there (a newline only joins whitespace runs, and
the regex's lookahead sees a non-space either way), so concatenating the segments' ids gives exactly the ids of
the whole document. `tests/data/test_data_segments.py` checks this on adversarial strings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEGMENT_CHARS = 1 << 13
# Python's \s covers every Unicode White_Space character (and a few more), so "\S" here is never whitespace
# for the tokenizer's regex either.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def split_at_safe_newlines(text: str, max_chars: int = SEGMENT_CHARS) -> list[str]:
    """Cut `text` into pieces of about `max_chars` (longer when no safe newline is near) that join back to it."""
    pieces, start = [], 0
    while len(text) - start > max_chars:
        match = _SAFE_CUT.search(text, start + max_chars)
        if match is None:
            break
        pieces.append(text[start : match.start()])
        start = match.start()
    pieces.append(text[start:])
    return pieces


def segment_documents(
    texts: Sequence[str | None], first_in_split: Sequence[bool], max_chars: int = SEGMENT_CHARS
) -> dict[str, list]:
    """Segments of each non-empty document, with `separator_before` marking where the EOS separator goes and
    `doc_start` where a document (or the split's clipped first one) begins, for tokenizers that add a BOS.

    The separator goes before every document except the first of its split, so documents are joined with
    exactly one separator between them; empty documents add nothing.
    """
    segments: list[str] = []
    separator_before: list[bool] = []
    doc_start: list[bool] = []
    for text, is_first in zip(texts, first_in_split, strict=True):
        if not text:
            continue
        for piece_index, piece in enumerate(split_at_safe_newlines(text, max_chars)):
            segments.append(piece)
            separator_before.append(piece_index == 0 and not is_first)
            doc_start.append(piece_index == 0)
    return {"text": segments, "separator_before": separator_before, "doc_start": doc_start}


def encode_segments(tokenizer, segments: dict[str, list]) -> list[list[int]]:
    """Token ids of each segment: the EOS separator before a document, then BOS if the tokenizer adds one.

    BOS goes once per document, not per segment (a pretrained Llama tokenizer adds it to every encode call).
    """
    eos, bos = tokenizer.eos_id, tokenizer.bos_id if tokenizer.add_bos else None
    encoded = tokenizer.encode_batch(segments["text"], add_bos=False)
    return [
        [*([eos] if separator else []), *([bos] if bos is not None and start else []), *ids]
        for ids, separator, start in zip(
            encoded, segments["separator_before"], segments["doc_start"], strict=True
        )
    ]


def segment_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    column: str,
    first_offset: int,
    last_index: int,
    last_limit: int | None,
    max_chars: int = SEGMENT_CHARS,
) -> dict[str, list]:
    """`Dataset.map` function: clip the split's first/last document to the character cut, then segment.

    Row 0 starts at character `first_offset`; row `last_index` ends at character `last_limit` (None: no clip).
    Both offsets are in the original document's coordinates, so the end is clipped before the start.
    """
    texts = []
    for index, text in zip(indices, batch[column], strict=True):
        text = text or ""
        if index == last_index and last_limit is not None:
            text = text[:last_limit]
        if index == 0:
            text = text[first_offset:]
        texts.append(text)
    return segment_documents(texts, [index == 0 for index in indices], max_chars)


@dataclass(frozen=True)
class CharCut:
    """A position in the concatenated documents: character `offset` of document `row`."""

    row: int
    offset: int


def find_char_cut(doc_lengths: np.ndarray, val_fraction: float) -> CharCut:
    """Where the last `val_fraction` of all characters starts (nanoGPT's `data[int(n * 0.9):]` for 0.1).

    The cut lands inside the document that holds that character; empty documents are skipped over.
    """
    ends = np.cumsum(doc_lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    cut = int(total * (1 - val_fraction))
    row = int(np.searchsorted(ends, cut, side="right"))
    if row >= len(ends):  # the cut is the very end: nothing held out
        return CharCut(row=len(ends) - 1, offset=int(doc_lengths[-1]))
    start_of_row = int(ends[row]) - int(doc_lengths[row])
    return CharCut(row=row, offset=cut - start_of_row)
