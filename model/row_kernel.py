"""The C++ one-row product of model/row_kernel.cpp (a batch-1 decode step's linear layers on kept blocks).

`row_product_op()` is `torch.ops.gqa_quant.row_product(x, words, scale, minimum, bits)` once it can run here,
else None. It is compiled at first use (about a minute) with AVX2 + FMA into a folder named by the hash of the
source, the flags and torch's version, under torch's extension cache (TORCH_EXTENSIONS_DIR, or
~/.cache/torch_extensions), so a later process loads the built library without compiling. A CPU without
AVX2 (checked at run time, as torch dispatches its own kernels), no C++ compiler or a failed build leaves it
None with one `note:` line, and `QuantizedLinear` keeps its float path. A fake implementation gives the
output's shape, so `torch.compile` graphs call the op too.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("row_kernel.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma"]  # not -march=native: the cached library may meet another CPU of this host
ENABLED = True  # a switch for benchmarks that time the float path in the same process
_loaded: dict[str, object] = {}  # "op": the op, or None once it could not be loaded


def row_product_op():
    """The op, loaded (or built) once per process, or None where it cannot run (after one note)."""
    if not ENABLED:
        return None
    if "op" not in _loaded:
        _loaded["op"] = _load()
    return _loaded["op"]


def library_path() -> Path:
    """Where the built library of this source, these flags and this torch lives (built or not)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + torch.__version__.encode())
    name = f"gqa_row_kernel_{key.hexdigest()[:12]}"
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / name / f"{name}.so"


def unusable_reason() -> str | None:
    """Why the kernel cannot run on this machine, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"a {platform.machine()} CPU; it is written for x86-64 AVX2"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "this CPU has no AVX2"
    return None


def _load():
    reason = unusable_reason()
    if reason is None:
        try:
            _open_or_build(library_path())
            _register_fake()
            return torch.ops.gqa_quant.row_product
        except (
            Exception
        ) as error:  # a compiler's or loader's failure, whatever its type: the float path stays
            lines = str(error).strip().splitlines()  # a compiler's log: its last line says why
            reason = f"its build failed: {lines[-1] if lines else type(error).__name__}"
    print(
        f"note: the quantised one-row kernel is off ({reason}); decoding reads the blocks on the slower float path",
        file=sys.stderr,
    )
    return None


def _open_or_build(path: Path) -> None:
    if path.is_file():
        try:
            torch.ops.load_library(str(path))
            return
        except OSError:  # a damaged library (a killed build, a full disk): built again below
            path.unlink()
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler}) on PATH")
    print(
        f"note: compiling the quantised one-row kernel once (about a minute); cached in {path.parent}",
        file=sys.stderr,
        flush=True,
    )
    from torch.utils.cpp_extension import load  # its import costs a second: only when building

    path.parent.mkdir(parents=True, exist_ok=True)
    load(
        name=path.stem,
        sources=[str(SOURCE)],
        extra_cflags=FLAGS,
        build_directory=str(path.parent),
        is_python_module=False,
        verbose=False,
    )


def _register_fake() -> None:
    @torch.library.register_fake("gqa_quant::row_product")
    def _(x, words, scale, minimum, bits):
        return x.new_empty(*x.shape[:-1], words.shape[-1])
