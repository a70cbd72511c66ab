"""Measurements that print a ratio against a baseline measured in the same run; running them: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from common.errors import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
# train.py flags: no validation, samples, attention maps, logging or progress bar (benchmarks score themselves).
QUIET = ["--trainer.logger", "false", "--trainer.limit_val_batches", "0", "--samples.every_n_steps", "0",
         "--attention_maps.every_n_steps", "0", "--trainer.enable_progress_bar", "false"]  # fmt: skip


def new_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first paragraph."""
    return OneLineParser(description=doc.split("\n\n")[0])


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (0 repeats has no median, 0 batches no rate)."""
    return _count(text, 1)


def _count(text: str, minimum: int) -> int:
    try:
        if int(text) >= minimum:
            return int(text)
    except ValueError:  # not a whole number: the same one line as a too small one
        pass
    raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")


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
