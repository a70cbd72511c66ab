"""Documents -> token ids, the one encoding both pipelines use (text in segments, conversations with a mask), and
the held-out character cut.

Long documents are cut into segments of a few KB (parallel, bounded memory) only after a lone newline between two
non-space characters, where the byte-level pre-tokenizer always ends a piece: the segments' ids joined are the
whole document's.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from common.errors import UserError
from data import DataConfigError
from data.tokenizer import Tokenizer

if TYPE_CHECKING:  # `datasets` takes seconds to import; data.datamodule imports this module (via data.stream)
    from datasets import Dataset

SEGMENT_CHARS = 1 << 13
DOCS_PER_BATCH = 256
# Python's \s covers every Unicode White_Space character (and a few more), so "\S" here is never whitespace
# for the tokenizer's regex either.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")
ROLES = ("system", "user", "assistant")
FIX = "fix or drop that row"


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
    """Segments of each non-empty document, with `separator_before` where the EOS goes (before every document but
    the first of its split) and `doc_start` where a document begins (for a BOS)."""
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


def encode_segments(tokenizer: Tokenizer, segments: dict[str, list]) -> list[list[int]]:
    """Token ids of each segment: EOS before a document, then BOS if the tokenizer adds one (once a document)."""
    eos, bos = tokenizer.eos_id, tokenizer.bos_id if tokenizer.add_bos else None
    encoded = tokenizer.encode_batch(segments["text"], add_bos=False)
    return [
        [*([eos] if separator else []), *([bos] if bos is not None and start else []), *ids]
        for ids, separator, start in zip(
            encoded, segments["separator_before"], segments["doc_start"], strict=True
        )
    ]


def document_ids(texts: list[str | None], tokenizer: Tokenizer) -> np.ndarray:
    """Ids of `texts` as one stream, EOS (and BOS if the tokenizer adds one) before every non-empty document;
    DOCS_PER_BATCH documents at a time, so only their ids are ever Python ints."""
    arrays = [np.zeros(0, np.int64)]
    for at in range(0, len(texts), DOCS_PER_BATCH):
        batch = texts[at : at + DOCS_PER_BATCH]
        pieces = encode_segments(tokenizer, segment_documents(batch, [False] * len(batch)))
        arrays.append(np.fromiter((i for piece in pieces for i in piece), dtype=np.int64))
    return np.concatenate(arrays)


def segment_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    column: str,
    first_offset: int,
    last_index: int,
    last_limit: int | None,
) -> dict[str, list]:
    """Segments of `batch` clipped to the hold-out cut: row 0 starts at character `first_offset`, row `last_index`
    ends at character `last_limit` (None: no clip), both in the original document."""
    texts = []
    for index, text in zip(indices, batch[column], strict=True):
        text = text or ""
        if index == last_index and last_limit is not None:
            text = text[:last_limit]
        if index == 0:
            text = text[first_offset:]
        texts.append(text)
    return segment_documents(texts, [index == 0 for index in indices])


class CharCut(NamedTuple):
    """A position in the concatenated documents: character `offset` of document `row`."""

    row: int
    offset: int


def find_char_cut(doc_lengths: np.ndarray, val_fraction: float) -> CharCut:
    """Where the last `val_fraction` of all characters starts (nanoGPT's `data[int(n * 0.9):]` for 0.1)."""
    ends = np.cumsum(doc_lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    cut = int(total * (1 - val_fraction))
    row = int(np.searchsorted(ends, cut, side="right"))
    if row >= len(ends):  # the cut is the very end: nothing held out
        return CharCut(row=len(ends) - 1, offset=int(doc_lengths[-1]))
    start_of_row = int(ends[row]) - int(doc_lengths[row])
    return CharCut(row=row, offset=cut - start_of_row)


def document_lengths(docs: Dataset, column: str, chat: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Characters and UTF-8 bytes per document (0 for null), computed in Arrow without Python strings; for
    conversations (`chat`), their contents' bytes for both."""
    if chat:
        sizes = conversation_sizes(docs[column])
        return sizes, sizes
    import pyarrow.compute as pc

    chars, sizes = [], []
    for table in docs.with_format("arrow").iter(batch_size=10_000):
        chars.append(pc.utf8_length(table[column]).fill_null(0).to_numpy())
        sizes.append(pc.binary_length(table[column]).fill_null(0).to_numpy())
    if not chars:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(chars).astype(np.int64), np.concatenate(sizes).astype(np.int64)


def conversation_sizes(rows: Sequence[object]) -> np.ndarray:
    """UTF-8 bytes of each conversation's contents: the tokenize stage's measure of work."""
    return np.array(
        [sum(len(str(m.get("content") or "").encode("utf-8")) for m in row or [] if isinstance(m, dict))
         for row in rows],
        dtype=np.int64,
    )  # fmt: skip


def encode_conversation(tokenizer: Tokenizer, messages: object, where: str) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation, mask 1 on the assistant's ids; `where` names the row in errors. Assistant
    turn i spans from the end of messages[:i] rendered with the generation prompt to the end of messages[:i + 1], so
    any chat template works and its turn closer is learned; a token is the assistant's if its first character is."""
    messages = _checked(messages, where)
    try:
        text = tokenizer.render_chat(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            opened = tokenizer.render_chat(messages[:i], add_generation_prompt=True) if i else ""
            closed = tokenizer.render_chat(messages[: i + 1], add_generation_prompt=False)
            if not (closed.startswith(opened) and text.startswith(closed)):
                raise DataConfigError(
                    f"{where}: the chat template does not render message {i} as a continuation of the messages "
                    "before it, so the assistant's tokens cannot be found; use a model whose template does"
                )
            spans.append((len(opened), len(closed)))
    except DataConfigError:
        raise
    except UserError as error:  # the template refused these messages
        raise DataConfigError(f"{where}: {error}; {FIX}") from None
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask = [int(any(start <= first < stop for start, stop in spans)) for first, _ in offsets]
    if not any(mask):
        raise DataConfigError(f"{where}: the assistant's turns render as no tokens; {FIX}")
    return ids, mask


def row_name(row: int, split: str) -> str:
    """How an error names a conversation: the config key, then the row and its split."""
    return f"data.chat_column: row {row} of the {split} split"


def encode_conversations(
    tokenizer: Tokenizer, rows: Sequence[object], names: Iterable[str], eos_first: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of `rows` (named by `names` in errors) packed like text: an EOS (mask 0) before each
    conversation, the first only with `eos_first`."""
    ids: list[int] = []
    mask: list[int] = []
    for index, (messages, where) in enumerate(zip(rows, names, strict=True)):
        row_ids, row_mask = encode_conversation(tokenizer, messages, where)
        separator = [tokenizer.eos_id] if index or eos_first else []
        ids += [*separator, *row_ids]
        mask += [0] * len(separator) + row_mask
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=np.uint8)


def mask_name(token_file: str) -> str:
    """The assistant-mask file beside a chat token file: one uint8 per token, 1 where the assistant wrote it."""
    return f"{token_file}.mask"


def row_digest(row: object) -> str:
    """Identifies a held-out row (a text, or a conversation's messages), so stream readers can leave it out."""
    text = row if isinstance(row, str) else json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _checked(messages: object, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise DataConfigError(
            f"{where}: a conversation is a non-empty list of messages, got {messages!r:.60}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataConfigError(
                f"{where}: message {i} needs a string 'content', got {message!r:.60}; {FIX}"
            )
        if message.get("role") not in ROLES:
            raise DataConfigError(
                f"{where}: message {i} has role {message.get('role')!r}; roles are {', '.join(ROLES)}; {FIX}"
            )
    if not any(message["role"] == "assistant" for message in messages):
        raise DataConfigError(f"{where}: the conversation has no assistant turn, so nothing to learn; {FIX}")
    # Only the keys the format defines: a dataset's extra columns inside messages would reach the template.
    return [{"role": message["role"], "content": message["content"]} for message in messages]
