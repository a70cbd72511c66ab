"""Linear layers whose weights stay in blocks of codes, as a GGUF file stores them (Q4_0, Q4_1, Q8_0, and the
K-quants' sub-blocks: Q4_K, Q5_K of 32, Q6_K of 16; interop/gguf_blocks.py).

Weight j of block b is `scale[b] * code[j] + minimum[b]`, computed in float32: the very value the `gguf`
package's dequantisation gives. A 4-bit weight takes 6 bits with its block's float32 scale and minimum:
SmolLM2-135M's matrices shrink from 540 MB to 111 MB, and a decode step, which reads every weight once, reads
that much less (`python -m benchmarks.decode_vs_hf --configs smollm2`). The codes are packed into int32 words
laid out (block, word, output), so a one-row product is a sum over blocks and words that reads each word once,
vectorised across outputs: on the CPU the C++ kernel of model/row_kernel.cpp (`row_product_op`, below), eagerly
and in the compiled step; where it cannot run, the same sum in torch (which Inductor fuses). More rows (a
prefill, several samples, a speculative check) dequantise the whole matrix and keep the matrix product.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 32  # codes per group of packed words; a block (one scale and minimum) is this or half of it
BLOCK_SIZES = (16, 32)  # Q6_K's sub-blocks hold 16 codes, every other type's 32


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(out, in) integer codes -> int32 words (in / 32, bits, out): word w of a block holds codes w*k .. w*k+k-1
    (k = 32 / bits), the first in the lowest bits. 8-bit codes may be negative (two's complement bytes)."""
    out, inp = codes.shape
    per_word = 32 // bits
    fields = (codes.to(torch.int64) & ((1 << bits) - 1)).view(out, inp // BLOCK, bits, per_word)
    shifts = bits * torch.arange(per_word, device=codes.device)
    words = (fields << shifts).sum(-1)  # (out, nb, bits), in [0, 2^32)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.permute(1, 2, 0).contiguous()


class QuantizedLinear(nn.Module):
    """`y = x Wᵀ` with W kept as 4-bit (unsigned, with a minimum) or 8-bit (signed) block codes.

    Args:
        codes: (out, in) integer codes, `in` a multiple of 32; 0..15 for 4 bits, -128..127 for 8 bits.
        scale: (out, in / block) float32 scale of each block.
        minimum: (out, in / block) float32 offset of each block, or None (Q8_0 and Q6_K have none).
        bits: 4 or 8.
        block: codes per block, 32 or 16.
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        minimum: torch.Tensor | None,
        bits: int,
        block: int = BLOCK,
    ) -> None:
        super().__init__()
        if bits not in (4, 8) or block not in BLOCK_SIZES or codes.shape[1] % BLOCK:
            raise ValueError(
                f"blocks of 16 or 32 4- or 8-bit codes, {BLOCK} dividing the inputs; got {bits} bits, blocks of "
                f"{block} and {codes.shape[1]} inputs"
            )
        if scale.shape != (codes.shape[0], codes.shape[1] // block):
            raise ValueError(
                f"one scale per block of {block}: {tuple(scale.shape)} for codes {tuple(codes.shape)}"
            )
        self.bits, self.block = bits, block
        self.out_features, self.in_features = codes.shape
        self.register_buffer("words", pack_codes(codes, bits))
        self.register_buffer("scale", scale.t().contiguous().float())  # (nb, out)
        self.register_buffer("minimum", None if minimum is None else minimum.t().contiguous().float())
        if codes.device.type == "cpu":
            row_product_op()  # loaded (or built) now: a compiled step's trace cannot build it

    def _apply(self, fn, recurse=True):
        converts_to = fn(torch.zeros(1, device=self.words.device)).dtype  # .half(), .to(torch.bfloat16)
        if converts_to != torch.float32:
            raise TypeError(
                "QuantizedLinear computes in float32: rounding its scales would change the weights"
            )
        return super()._apply(fn, recurse)

    def code(self, i: int) -> torch.Tensor:
        """Float codes (nb, bits, out) of field i of every word: input i of each group of 32 / bits."""
        if self.bits == 4:
            return ((self.words >> (4 * i)) & 15).float()
        return ((self.words << (24 - 8 * i)) >> 24).float()  # the arithmetic shift restores the sign

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (out, in)."""
        codes = torch.stack([self.code(i) for i in range(32 // self.bits)], dim=2)  # (nb, bits, k, out)
        # In place: a prefill dequantises every matrix, so each pass over them counts.
        weight = codes.view(-1, self.block, self.out_features).mul_(self.scale[:, None])
        if self.minimum is not None:
            weight.add_(self.minimum[:, None])
        return weight.view(self.in_features, self.out_features).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() != 1:
            return F.linear(x, self.dequantize().to(x.dtype))
        kernel = self._row_kernel(x)
        if kernel is not None:
            return kernel(x, self.words, self.scale, self.minimum, self.bits)
        k = 32 // self.bits  # inputs per word
        groups = x.float().reshape(-1, self.bits, k)  # (nb, bits, k): the inputs of each word
        per_word = sum(self.code(i) * groups[:, :, i, None] for i in range(k))  # (nb, bits, out)
        per_block = per_word.view(-1, self.block // k, self.out_features).sum(1)  # the words of each block
        y = (self.scale * per_block).sum(0)  # (out,)
        if self.minimum is not None:
            y = y + (self.minimum * groups.reshape(-1, self.block).sum(1)[:, None]).sum(0)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _row_kernel(self, x: torch.Tensor):
        """The C++ one-row product (`row_product_op`) where it applies: a float32 row on the CPU without
        autograd, and blocks of 32 inputs (words (in / 32, bits, out)); None keeps the float path below."""
        if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
            return None
        if self.block != BLOCK or self.words.shape[1] != self.bits:  # Q6_K's 16-blocks keep the float path
            return None
        return row_product_op()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, block={self.block}"


# The C++ one-row product of model/row_kernel.cpp. It is compiled at first use (about a minute) with AVX2 + FMA
# into a folder named by the hash of the source, the flags and torch's version, under torch's extension cache
# (TORCH_EXTENSIONS_DIR, or ~/.cache/torch_extensions), so a later process loads the built library without
# compiling. A CPU without AVX2 (checked at run time, as torch dispatches its own kernels), no C++ compiler or a
# failed build leaves it off with one `note:` line, and `QuantizedLinear` keeps its float path. A fake
# implementation gives the output's shape, so `torch.compile` graphs call the op too.
SOURCE = Path(__file__).with_name("row_kernel.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma"]  # not -march=native: the cached library may meet another CPU of this host
_loaded: dict[str, object] = {}  # "op": the op, or None once it could not be loaded


def row_product_op():
    """`torch.ops.gqa_quant.row_product(x, words, scale, minimum, bits)`, loaded (or built) once per process,
    or None where it cannot run (after one note)."""
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
    print(f"note: the quantised one-row kernel is off ({reason}); decoding reads the blocks on the slower float "
          "path", file=sys.stderr)  # fmt: skip
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
    print(f"note: compiling the quantised one-row kernel once (about a minute); cached in {path.parent}",
          file=sys.stderr, flush=True)  # fmt: skip
    from torch.utils.cpp_extension import load  # its import costs a second: only when building

    path.parent.mkdir(parents=True, exist_ok=True)
    load(name=path.stem, sources=[str(SOURCE)], extra_cflags=FLAGS, build_directory=str(path.parent),
         is_python_module=False, verbose=False)  # fmt: skip


def _register_fake() -> None:
    @torch.library.register_fake("gqa_quant::row_product")
    def _(x, words, scale, minimum, bits):
        return x.new_empty(*x.shape[:-1], words.shape[-1])
