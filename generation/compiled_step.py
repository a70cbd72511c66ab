"""The compiled decode step kept between processes: built once per model, shape and torch, then loaded
(docs/decoding.md). A damaged or stale file (its header holds the payload's hash) is built again."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

import cpu_kernels
import generation.static_decode
import model as model_package
from common.files import atomic_write
from generation.static_decode import static_cache_length, static_decoder

DIR_ENV = "GQA_GPT_COMPILED_DIR"


def folder() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "gqa-gpt" / "compiled")


def step_sources() -> list[Path]:
    """The files the step is built from: the network (model/), the kernels and kept layers (cpu_kernels/) and
    the static step itself. A change to any of them builds the step again."""
    packages = [Path(model_package.__file__).parent, Path(cpu_kernels.__file__).parent]
    found = [
        path for folder in packages for path in sorted(folder.iterdir()) if path.suffix in (".py", ".cpp")
    ]
    return [*found, Path(generation.static_decode.__file__)]


def artifact(model: torch.nn.Module, batch: int, length: int) -> tuple[Path, str]:
    """The file of the compiled step for this model, batch and length (prompt + new tokens), and its key."""
    key = hashlib.sha256()
    for path in step_sources():
        key.update(path.read_bytes())
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    shape = [model.config, model, [(name, t.shape, t.dtype, t.device) for name, t in tensors]]
    shape += [batch, static_cache_length(length, model.config.block_size), torch.__version__]
    key.update(repr(shape).encode())
    key = key.hexdigest()[:32]
    return folder() / f"{key}.bin", key


def note(text: str, end: str = "\n") -> None:
    print(f"note: {text}", end=end, file=sys.stderr, flush=True)


def compiled_step(model: torch.nn.Module, batch: int, length: int) -> None:
    """Make the compiled decode step ready (`--compile`): loaded where an earlier run kept it, else built and
    kept. Only when asked: loading one costs seconds (the compiler's import, its kernels), which a short
    generation does not win back (docs/decoding.md)."""
    # Off the CPU the step is compiled in this process only: keeping one that replays CUDA graphs is untested.
    if next(model.parameters()).device.type != "cpu":
        note("--compile builds the decode step first (tens of seconds)")
        static_decoder(model, batch, length=length).warm_up()
        return
    path, key = artifact(model, batch, length)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder() / "inductor"))
    decoder = static_decoder(model, batch, length=length)
    step = load(path, key) if path.is_file() else None
    if step is not None:
        # Said without "you": another process (or user of this cache) may have built it.
        note(f"decoding with the kept compiled step of this model and shape ({path})")
        decoder.use(step)
        decoder.warm_up()  # its kernels loaded now, not at the first token
        return
    from torch._dynamo.aot_compile import AOTCompiledFunction  # imports dynamo: only when compiling

    start = time.perf_counter()
    with ticking():
        step = decoder.compile_ahead()
    note(f"compiled the decode step in {time.perf_counter() - start:.1f} s; kept in {path}")
    try:
        payload = AOTCompiledFunction.serialize(step).serialized_data
        atomic_write(path, header(key, payload) + b"\n" + payload)
    except OSError as err:
        note(f"the compiled step could not be kept in {path} ({err.strerror}); the next run builds it again")


def header(key: str, payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest()
    return json.dumps({"key": key, "torch": torch.__version__, "sha256": digest}).encode()


def load(path: Path, key: str) -> Callable | None:
    """The step kept in `path`; None, after a note, for a damaged or stale file."""
    head, _, payload = path.read_bytes().partition(b"\n")
    if head == header(key, payload):
        with contextlib.suppress(Exception):  # a payload this torch cannot read, though its bytes are intact
            return torch.compiler.load_compiled_function(io.BytesIO(payload))
    note(f"the compiled step in {path} is damaged or from another torch ({torch.__version__} here); "
         "building it again")  # fmt: skip
    return None


@contextlib.contextmanager
def ticking():
    """A note before the compile; on a terminal, the seconds since then ticking at its end."""
    start, done, tty = time.perf_counter(), threading.Event(), sys.stderr.isatty()
    text = "compiling the decode step for this model and shape, once ..."
    note(text, end="" if tty else "\n")

    def tick() -> None:
        while not done.wait(1):
            print(f"\rnote: {text} {time.perf_counter() - start:.0f} s", end="", file=sys.stderr, flush=True)

    if tty:
        threading.Thread(target=tick, daemon=True).start()
    try:
        yield
    finally:
        done.set()
        print(end="\n" if tty else "", file=sys.stderr)
