"""Measurements that print a ratio against a baseline measured in the same run; running them: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common.errors import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd")
# train.py flags: no validation, samples, attention maps, logging or progress bar (benchmarks score themselves).
QUIET = ["--trainer.logger", "false", "--trainer.limit_val_batches", "0", "--samples.every_n_steps", "0",
         "--attention_maps.every_n_steps", "0", "--trainer.enable_progress_bar", "false"]  # fmt: skip


def new_parser(doc: str, **shape: int) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first paragraph, with a flag for each model-shape argument in `shape`."""
    parser = OneLineParser(description=doc.split("\n\n")[0])
    for name, default in shape.items():
        parser.add_argument(f"--{name}", type=int, default=default, help=f"the model's ModelConfig.{name}")
    return parser


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (0 repeats has no median, 0 batches no rate)."""
    return _count(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type of a count where 0 skips that part of a benchmark."""
    return _count(text, 0)


def _count(text: str, minimum: int) -> int:
    try:
        if int(text) >= minimum:
            return int(text)
    except ValueError:  # not a whole number: the same one line as a too small one
        pass
    raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    return {name: getattr(args, name) for name in SHAPE}


def in_fresh_process(fn, *args):
    """fn(*args) in a spawned (not forked) interpreter: no memory or thread pool of this process carries over."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(fn, *args).result()


def launch_to_exit(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(seconds from launch to exit, peak resident GB) of one process run from the repository root; a failure
    ends the benchmark with the end of its output."""
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: llama.cpp's log would fill a pipe and block
        begin = time.perf_counter()
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT, env=env
        )
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - begin
        if (code := os.waitstatus_to_exitcode(status)) != 0:
            log.seek(0)
            raise SystemExit(
                f"{' '.join(command)} exited {code}:\n{log.read().decode(errors='replace')[-3000:]}"
            )
    return seconds, usage.ru_maxrss * 1024 / 1e9  # Linux counts kilobytes
