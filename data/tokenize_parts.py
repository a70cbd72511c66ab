"""Tokenize planned parts in `num_proc` processes, each writing its own part file, with a MB/s and ETA line.

A part is written under a temporary name and renamed when complete, so after a kill the finished parts stay
and a rerun tokenizes only the others. The processes are forked: they inherit the memory-mapped Arrow
documents and the tokenizer, and each runs one tokenizer thread (the processes already use the cores).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from common.files import atomic_path
from data.segments import encode_segments
from data.tokenize_dataset import Part
from data.tokenizer import Tokenizer

REPORT_EVERY_S = 2.0
_shared: dict[str, Any] = {}  # what the forked processes inherit: the byte counter, tokenizer and settings


def tokenize_parts(
    parts: list[Part], tokenizer: Tokenizer, column: str, out_dir: Path, dtype: np.dtype, num_proc: int
) -> None:
    """Write every part of `parts` missing from `out_dir`; prints progress to stderr."""
    todo = [part for part in parts if not (out_dir / part.name).is_file()]
    if not todo:
        return
    total = sum(part.text_bytes for part in todo)
    kept = len(parts) - len(todo)
    procs = max(1, min(num_proc, len(todo)))
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    counter = context.Value("q", 0)
    _shared.update(counter=counter, tokenizer=tokenizer, column=column, out_dir=out_dir, dtype=dtype)
    progress = Progress(total, f"tokenizing {len(todo)} parts ({kept} kept from an earlier run)", counter)
    if procs == 1:
        for part in todo:
            _tokenize_part(part)
            progress.report()
    else:
        with _one_thread_per_process(), context.Pool(procs) as pool:
            result = pool.map_async(_tokenize_part, todo, chunksize=1)
            while not result.ready():
                result.wait(REPORT_EVERY_S)
                progress.report()
            result.get()  # re-raises a worker's error
    progress.report(final=True)


def _tokenize_part(part: Part) -> None:
    tokenizer: Tokenizer = _shared["tokenizer"]
    with atomic_path(_shared["out_dir"] / part.name) as temp, open(temp, "wb") as file:
        for start, stop in part.chunks():
            segments = part.read(start, stop, _shared["column"])
            for ids in encode_segments(tokenizer, segments):
                np.asarray(ids, dtype=_shared["dtype"]).tofile(file)
            counter = _shared["counter"]
            with counter.get_lock():
                counter.value += sum(len(text.encode("utf-8")) for text in segments["text"])


class Progress:
    """One line every REPORT_EVERY_S: MB done of total, MB/s and ETA (a carriage return on a terminal)."""

    def __init__(self, total_bytes: int, what: str, counter: Any) -> None:
        self.total = max(1, total_bytes)
        self.counter = counter
        self.started = time.monotonic()
        self.last = 0.0
        self.tty = sys.stderr.isatty()
        print(f"data: {what}, {total_bytes / 1e6:,.1f} MB of text", file=sys.stderr, flush=True)

    def report(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < REPORT_EVERY_S:
            return
        self.last = now
        # The cut document's share is estimated by characters, so the count may pass the total slightly.
        done = self.total if final else min(self.counter.value, self.total)
        elapsed = max(now - self.started, 1e-9)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate else float("inf")
        line = (
            f"data: {done / 1e6:,.1f}/{self.total / 1e6:,.1f} MB ({100 * done / self.total:.0f}%), "
            f"{rate / 1e6:.2f} MB/s, ETA {_duration(eta)}"
        )
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


@contextmanager
def _one_thread_per_process() -> Iterator[None]:
    """Forked processes each run one tokenizer thread; set before the fork, so the Rust pool does not warn."""
    if "TOKENIZERS_PARALLELISM" in os.environ:
        yield
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        del os.environ["TOKENIZERS_PARALLELISM"]
