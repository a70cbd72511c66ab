"""The C++ CPU kernels of cpu_kernels/row_kernel.cpp, built once and loaded as torch ops (`gqa_quant::*`):
`row_product` (a few float32 rows times GGUF block codes: `QuantizedLinear`), `dequantize_rows` (its weight in
float32, a group of outputs at a time, for products of many rows), `pack_codes` (block codes into its words),
`float_rows` (a few float32 rows times a float32 weight) and `one_query_attention` (one query per head over a
float32 KV cache), the last two called by the compiled decode step (generation/static_decode.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

# It is compiled at first use (about a minute) with AVX2 + FMA
# into a folder named by the hash of the source, the flags and torch's version, under torch's extension cache
# (TORCH_EXTENSIONS_DIR, or ~/.cache/torch_extensions), so a later process loads the built library without
# compiling. A CPU without AVX2 (checked at run time, as torch dispatches its own kernels), no C++ compiler or a
# failed build leaves it off with one `note:` line, and `QuantizedLinear` keeps its float path. A fake
# implementation gives the output's shape, so `torch.compile` graphs call the op too.
SOURCE = Path(__file__).with_name("row_kernel.cpp")
# Not -march=native: the cached library may meet another CPU of this host; the instruction set is picked at run
# time instead (`flags`). -fopenmp: without it at::parallel_for compiles to a plain call and the kernel runs on
# one thread; the libgomp it links is the one torch has loaded. -ffp-contract=off: a multiply-add is fused only
# where the code asks (`ffma`), so the dequantised weights equal torch's unpacking bit for bit.
FLAGS = ["-O3", "-mfma", "-fopenmp", "-ffp-contract=off"]
ISA_FLAGS = {"avx2": ["-mavx2"], "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]}
_loaded: dict[str, object] = {}  # "op": the op, or None once it could not be loaded


def row_product_op():
    """`torch.ops.gqa_quant.row_product(x, words, scale, minimum, offset)`, loaded (or built) once per process,
    or None where it cannot run (after one note)."""
    if "op" not in _loaded:
        _loaded["op"] = _load()
    return _loaded["op"]


def flags() -> list[str]:
    """The compiler's flags for this CPU: AVX-512 with VNNI where it has them (16 outputs per vector and a fused
    multiply-accumulate: 1.1-1.4x AVX2's speed on SmolLM2's matrices, docs/decoding.md), else AVX2.
    GQA_ROW_KERNEL_ISA=avx2 forces the AVX2 build (the tests compare the two)."""
    isa = os.environ.get("GQA_ROW_KERNEL_ISA")
    if isa not in ISA_FLAGS:
        vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
        isa = "avx512" if torch.backends.cpu.get_cpu_capability() == "AVX512" and vnni else "avx2"
    return FLAGS + ISA_FLAGS[isa]


def library_path() -> Path:
    """Where the built library of this source, these flags and this torch lives (built or not)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags()).encode() + torch.__version__.encode())
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
        except Exception as error:  # any compiler's or loader's failure: the float path stays
            lines = str(error).strip().splitlines()  # a compiler's log: its last line says why
            reason = f"its build failed: {lines[-1] if lines else type(error).__name__}"
    print(
        f"note: the C++ row kernels are off ({reason}); decoding takes the slower torch path", file=sys.stderr
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
    print(f"note: compiling the C++ row kernels once (about a minute); cached in {path.parent}",
          file=sys.stderr, flush=True)  # fmt: skip
    from torch.utils.cpp_extension import load  # its import costs a second: only when building

    path.parent.mkdir(parents=True, exist_ok=True)
    load(name=path.stem, sources=[str(SOURCE)], extra_cflags=flags(), extra_ldflags=["-fopenmp"],
         build_directory=str(path.parent), is_python_module=False, verbose=False)  # fmt: skip


def _register_fake() -> None:
    @torch.library.register_fake("gqa_quant::row_product")
    def _(x, words, scale, minimum, offset):
        return x.new_empty(*x.shape[:-1], words.shape[-1])

    @torch.library.register_fake("gqa_quant::float_rows")
    def _(x, w):
        return x.new_empty(*x.shape[:-1], w.shape[0])

    @torch.library.register_fake("gqa_quant::one_query_attention")
    def _(q, k, v, visible):
        return q.new_empty(*q.shape[:-1], v.shape[-1])

    @torch.library.register_fake("gqa_quant::pack_codes")
    def _(codes, bits, order):
        return codes.new_empty(codes.shape[1] // 32, bits, codes.shape[0], dtype=torch.int32)

    @torch.library.register_fake("gqa_quant::dequantize_rows")
    def _(words, scale, minimum, offset, start, w):
        return None


def float_rows_op():
    """`torch.ops.gqa_quant.float_rows(x, w)`, the same library's product of a few float32 rows with a float32
    weight (out, in), or None where the library cannot run."""
    return row_product_op() and torch.ops.gqa_quant.float_rows


def dequantize_op():
    """`torch.ops.gqa_quant.dequantize_rows(words, scale, minimum, offset, start, w)`: writes outputs
    [start, start + n) of a `QuantizedLinear`'s weight in float32 into w (in, n), or None where the library cannot
    run."""
    return row_product_op() and torch.ops.gqa_quant.dequantize_rows


def pack_op():
    """`torch.ops.gqa_quant.pack_codes(codes, bits, order)`: int16 codes (out, in) packed as `QuantizedLinear`
    keeps them (int32 words (in / 32, bits, out)), or None where the library cannot run."""
    return row_product_op() and torch.ops.gqa_quant.pack_codes


def attention_op():
    """`torch.ops.gqa_quant.one_query_attention(q, k, v, visible)`, the same library's one-query attention over a
    float32 cache, or None where the library cannot run."""
    return row_product_op() and torch.ops.gqa_quant.one_query_attention
