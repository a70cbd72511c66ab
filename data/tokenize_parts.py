"""The token cache's tokenize stage (docs/data.md): the corpus cut into parts by the corpus alone, so a resumed build
(with any `num_proc`) finds the parts a killed one finished, each tokenized into its own file in `num_proc` processes.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from datasets import Dataset

from common.files import temp_path_for
from data import DataConfigError, documents
from data.tokenizer import Tokenizer

PART_BYTES = 64 << 20
# The tokenizer trains on at most this much text, spread evenly over the train documents: enough for stable
# merge statistics at a 32k-50k vocab, small enough to train in a few minutes and bounded memory.
TOKENIZER_SAMPLE_BYTES = 64 << 20
_ROWS_PER_READ = 512
REPORT_EVERY_S = 2.0


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
        """Row ranges read and tokenized at once."""
        return [
            (start, min(self.stop, start + _ROWS_PER_READ))
            for start in range(self.first, self.stop, _ROWS_PER_READ)
        ]

    def read(self, start: int, stop: int, column: str) -> dict[str, list]:
        return documents.segment_batch(
            self.docs[start:stop],
            [row - self.split_start for row in range(start, stop)],
            column=column,
            first_offset=self.first_offset,
            last_index=self.last_index,
            last_limit=self.last_limit,
        )


class Plan(NamedTuple):
    train: list[Part]
    val: list[Part]
    val_source: str


def plan_parts(
    train_docs: Dataset,
    val_docs: Dataset | None,
    column: str,
    corpus_key: str,
    val_fraction: float,
    chat: bool = False,
) -> Plan:
    """Cut both splits into parts. Without a validation split the hold-out is the last `val_fraction` of the
    characters (nanoGPT's), cut inside a document; conversations (`chat`) are held out whole."""
    train_docs = train_docs.select_columns([column])
    chars, sizes = documents.document_lengths(train_docs, column, chat)
    if not chars.sum():
        raise DataConfigError(
            f"{corpus_key}: the corpus has no text in column '{column}'; point it at real text"
        )
    if val_docs is not None:
        val_docs = val_docs.select_columns([column])
        train = _split_parts("train", train_docs, sizes, 0, len(train_docs))
        val = _split_parts(
            "val", val_docs, documents.document_lengths(val_docs, column, chat)[1], 0, len(val_docs)
        )
        return Plan(train, val, "the dataset's validation split")
    cut = documents.find_char_cut(chars, val_fraction)
    if chat:
        cut = documents.CharCut(min(cut.row + (cut.offset > 0), len(train_docs) - 1), 0)
    if cut.row == 0 and cut.offset == 0:
        raise DataConfigError(
            f"data.val_fraction: {val_fraction} holds out all of the text; use a smaller value"
        )
    if chat:
        train = _split_parts("train", train_docs, sizes, 0, cut.row)
        val = _split_parts("val", train_docs, sizes, cut.row, len(train_docs))
        return Plan(train, val, f"the last {val_fraction:g} of the train split's conversations")
    train = _split_parts(
        "train", train_docs, sizes, 0, cut.row + 1, chars, last_row=cut.row, last_limit=cut.offset
    )
    val = _split_parts("val", train_docs, sizes, cut.row, len(train_docs), chars, first_offset=cut.offset)
    return Plan(train, val, f"the last {val_fraction:g} of the train split's characters")


def _split_parts(
    split: str,
    docs: Dataset,
    sizes: np.ndarray,
    start: int,
    stop: int,
    chars: np.ndarray | None = None,
    first_offset: int = 0,
    last_row: int = -1,
    last_limit: int | None = None,
) -> list[Part]:
    """Consecutive parts of rows [start, stop) of about PART_BYTES of text each (at least one row); `text_bytes`
    counts only a clipped document's share (by characters), so the one the hold-out cuts is not counted twice."""
    ends = np.cumsum(sizes[start:stop], dtype=np.int64)
    kept = sizes[start:stop].copy()
    if first_offset:
        kept[0] -= sizes[start] * first_offset // max(1, chars[start])
    if last_limit is not None:
        kept[last_row - start] = sizes[last_row] * last_limit // max(1, chars[last_row])
    kept_ends = np.cumsum(kept, dtype=np.int64)
    bounds = [0]
    while bounds[-1] < len(ends):
        done = int(ends[bounds[-1] - 1]) if bounds[-1] else 0
        bounds.append(max(bounds[-1] + 1, int(np.searchsorted(ends, done + PART_BYTES, side="left")) + 1))
    bounds[-1] = min(bounds[-1], len(ends))
    last_index = last_row - start if last_row >= 0 else -1
    parts = []
    for index, (first, stop_row) in enumerate(itertools.pairwise(bounds)):
        text = int(kept_ends[stop_row - 1]) - (int(kept_ends[first - 1]) if first else 0)
        parts.append(
            Part(f"{split}-{index:05d}.bin", docs, start, start + first, start + stop_row, first_offset, last_index,
                 last_limit, text)
        )  # fmt: skip
    return parts


def tokenizer_sample(parts: list[Part], column: str) -> Iterator[list[str]]:
    """At most TOKENIZER_SAMPLE_BYTES of train text: every k-th chunk of documents across the train parts."""
    chunks = [(part, chunk) for part in parts for chunk in part.chunks()]
    total = sum(part.text_bytes for part in parts)
    stride = max(1, min(len(chunks), -(-total // TOKENIZER_SAMPLE_BYTES)))
    taken = 0
    for part, (start, stop) in chunks[::stride]:
        segments = part.read(start, stop, column)
        texts = [text[: max(0, TOKENIZER_SAMPLE_BYTES - taken)] for text in segments["text"]]
        taken += sum(len(text.encode("utf-8")) for text in texts)
        yield [text for text in texts if text]
        if taken >= TOKENIZER_SAMPLE_BYTES:
            return


_shared: dict[str, Any] = {}  # what the forked processes inherit: the byte counter, tokenizer and settings


def tokenize_parts(
    parts: list[Part],
    tokenizer: Tokenizer,
    column: str,
    out_dir: Path,
    dtype: np.dtype,
    num_proc: int,
    chat: bool = False,
) -> None:
    """Write every part missing from `out_dir` (with `chat`, its mask too); progress on stderr."""
    todo = [part for part in parts if not (out_dir / part.name).is_file()]
    if not todo:
        return
    procs = max(1, min(num_proc, len(todo)))
    context = multiprocessing.get_context("fork" if procs > 1 else None)  # settings.num_procs: 1 without fork
    counter = context.Value("q", 0)
    _shared.update(
        counter=counter, tokenizer=tokenizer, column=column, out_dir=out_dir, dtype=dtype, chat=chat
    )
    what = f"tokenizing {len(todo)} parts ({len(parts) - len(todo)} kept from an earlier run)"
    progress = Progress(sum(part.text_bytes for part in todo), what, counter)
    if procs == 1:
        for part in todo:
            _tokenize_part(part)
            progress.report()
    else:
        # One tokenizer thread per process, set before the fork, so the Rust pool does not warn either.
        set_here = "TOKENIZERS_PARALLELISM" not in os.environ
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            with context.Pool(procs, initializer=_exit_with_parent, initargs=(os.getpid(),)) as pool:
                result = pool.map_async(_tokenize_part, todo, chunksize=1)
                while not result.ready():
                    result.wait(REPORT_EVERY_S)
                    progress.report()
                result.get()  # re-raises a worker's error
        finally:
            if set_here:
                del os.environ["TOKENIZERS_PARALLELISM"]
    progress.report(final=True)


def _tokenize_part(part: Part) -> None:
    out_dir: Path = _shared["out_dir"]
    names = [part.name, documents.mask_name(part.name)] if _shared["chat"] else [part.name]
    # Beside the folder (where the cache sweep finds it), not in it; the mask is published first, so a part's token
    # file implies its mask.
    temps = [temp_path_for(out_dir.parent / f"{out_dir.name}-{name}") for name in names]
    try:
        with ExitStack() as stack:
            files = [stack.enter_context(open(temp, "wb")) for temp in temps]
            for start, stop in part.chunks():
                pieces, text_bytes = _encode_chunk(part, start, stop)
                for piece in pieces:  # (ids,) or (ids, mask)
                    for file, values, dtype in zip(files, piece, (_shared["dtype"], np.uint8), strict=False):
                        np.asarray(values, dtype=dtype).tofile(file)
                with _shared["counter"].get_lock():
                    _shared["counter"].value += text_bytes
        for temp, name in reversed(list(zip(temps, names, strict=True))):
            os.replace(temp, out_dir / name)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)


def _encode_chunk(part: Part, start: int, stop: int) -> tuple[list[tuple], int]:
    """(ids,) of each segment of rows [start, stop), or for chat (ids, assistant mask) of them all; their bytes."""
    tokenizer, column = _shared["tokenizer"], _shared["column"]
    if not _shared["chat"]:
        segments = part.read(start, stop, column)
        text_bytes = sum(len(text.encode("utf-8")) for text in segments["text"])
        return [(ids,) for ids in documents.encode_segments(tokenizer, segments)], text_bytes
    rows = part.docs[start:stop][column]
    split = str(part.docs.split or "train")
    names = (documents.row_name(row, split) for row in range(start, stop))
    pieces = [documents.encode_conversations(tokenizer, rows, names, eos_first=start != part.split_start)]
    return pieces, int(documents.conversation_sizes(rows).sum())


def _exit_with_parent(parent_pid: int) -> None:
    """Pool initializer: end silently once the parent is gone, not with BrokenPipeError tracebacks in the terminal."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class Progress:
    """One line every REPORT_EVERY_S: MB done of total, MB/s and ETA (a carriage return on a terminal)."""

    def __init__(self, total_bytes: int, what: str, counter: Any) -> None:
        self.total, self.counter = max(1, total_bytes), counter
        self.started, self.last = time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()
        print(f"data: {what}, {total_bytes / 1e6:,.1f} MB of text", file=sys.stderr, flush=True)

    def report(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < REPORT_EVERY_S:
            return
        self.last = now
        # The cut document's share is estimated by characters, so the count may pass the total slightly.
        done = self.total if final else min(self.counter.value, self.total)
        rate = done / max(now - self.started, 1e-9)
        eta = _duration((self.total - done) / rate) if rate else "?"
        line = (
            f"data: {done / 1e6:,.1f}/{self.total / 1e6:,.1f} MB ({100 * done / self.total:.0f}%), "
            f"{rate / 1e6:.2f} MB/s, ETA {eta}"
        )
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
