"""Linear layers whose weights stay in blocks of codes, as a GGUF file stores them (Q4_0 ... Q8_0, and the
K-quants' sub-blocks: Q4_K, Q5_K of 32, Q6_K of 16; interop/gguf_blocks.py), each type at its own code width.

Weight j of block b is `scale[b] * (code[j] - offset) + minimum[b]`, computed in float32: the very value the
`gguf` package's dequantisation gives. A 4-bit weight takes 5 or 6 bits with its block's float32 scale (and
minimum): SmolLM2-135M's matrices shrink from 540 MB to 111 MB, and a decode step, which reads every weight once,
reads that much less (`python -m benchmarks.decode_vs_hf --configs smollm2`). The codes are packed into int32
words laid out (block, word, output), so a one-row product is a sum over blocks and words that reads each word
once, vectorised across outputs: on the CPU the C++ kernel of cpu_kernels/row_kernel.cpp (`row_product_op`),
eagerly and in the compiled step, for up to `KERNEL_ROWS` rows; where it cannot run, the same sum in torch (which
Inductor fuses). More rows (a long prompt, QLoRA's training) dequantise the matrix 16 MB of rows at a time, in
C++ where it runs (`dequantize_rows`), and keep the matrix product.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from .library import dequantize_op, pack_op, row_product_op

BLOCK = 32  # codes per group of packed words; a block (one scale and minimum) is this or half of it
BLOCK_SIZES = (16, 32)  # Q6_K's sub-blocks hold 16 codes, every other type's 32
BITS = (4, 5, 6, 8)
# Up to this many rows (a short prompt, a speculative check, a few samples) the C++ kernel's integer sums beat
# dequantising the matrix for a float GEMM; more rows amortise the dequantisation (measured on SmolLM2's shapes:
# the kernel 1.2-1.3x faster at 32 rows on two of its three matrix shapes, 0.45-1.5x at 64, 0.5-0.7x at 128).
KERNEL_ROWS = 32
# Output rows packed at a time while loading: their int32 fields are the load's largest transient.
PACK_ROWS = 256
# The most float32 weight bytes a product of many rows dequantises at once (QuantizedLinear.row_slices).
DEQUANTISED_BYTES = 16 * 2**20


def _pack(fields: torch.Tensor, width: int) -> torch.Tensor:
    """(..., 32 / width) int32 fields below 2^width -> (...) int32 words, field i in bits width*i and up (the top
    field's shift wraps into the sign bit: the word's bits are what the kernel reads)."""
    words = fields[..., 0].clone()
    for i in range(1, 32 // width):
        words |= fields[..., i] << (width * i)
    return words


def _unpack(words: torch.Tensor, width: int) -> torch.Tensor:
    """(nb, n, out) int32 words -> (nb, n * 32 / width, out) their fields, word by word, lowest first."""
    shifts = width * torch.arange(32 // width, device=words.device, dtype=torch.int32)
    return ((words[:, :, None] >> shifts[:, None]) & ((1 << width) - 1)).flatten(1, 2)


def high_order(width: int) -> list[int]:
    """The codes of a block of 32 in the order their top `width` bits (5- and 6-bit codes) fill the high words:
    high word h holds pairs k = 16 h / width .. of codes (8 (k // 4) + k % 4, that + 4) in its low and high
    16 bits, so one shift and mask of it gives the pair the kernel reads from nibble k % 4 of word k // 4."""
    per = 16 // width
    return [
        8 * (k // 4) + 4 * half + k % 4
        for h in range(width)
        for half in (0, 1)
        for k in range(h * per, h * per + per)
    ]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(out, in) codes in [0, 2^bits) -> int32 words (in / 32, bits, out). 8 bits: word w holds codes 4w .. 4w+3
    a byte each, the first lowest. 4, 5, 6 bits: words 0-3 hold the low nibbles of codes 8w .. 8w+7, and 5 or 6
    bits add 1 or 2 words of the top bits (`high_order`). In C++ where it runs (one pass), else in torch."""
    if codes.device.type == "cpu" and pack_op():
        return pack_op()(codes.to(torch.int16), bits, high_order(bits - 4) if bits in (5, 6) else [])
    if codes.shape[0] > PACK_ROWS:  # a whole 1 B-class MLP matrix: a quarter GB of int32 fields
        return torch.cat([pack_codes(rows, bits) for rows in codes.split(PACK_ROWS)], dim=2)
    out, inp = codes.shape
    blocks = codes.to(torch.int32).view(out, inp // BLOCK, BLOCK)
    if bits == 8:
        words = _pack(blocks.view(out, -1, 8, 4), 8)
    else:
        words = _pack((blocks & 15).view(out, -1, 4, 8), 4)
        if bits > 4:
            high = (blocks[..., high_order(bits - 4)] >> 4).view(out, -1, bits - 4, 32 // (bits - 4))
            words = torch.cat([words, _pack(high, bits - 4)], dim=2)
    return words.permute(1, 2, 0).contiguous()


class QuantizedLinear(nn.Module):
    """`y = x Wᵀ` with W kept as unsigned 4-, 5-, 6- or 8-bit block codes: `scale * (code - offset) + minimum`.

    Args:
        codes: (out, in) integer codes in [0, 2^bits), `in` a multiple of 32.
        scale: (out, in / block) float32 scale of each block.
        minimum: (out, in / block) float32 offset of each block, or None (Q4_0, Q5_0, Q8_0, Q6_K have none).
        bits: 4, 5, 6 or 8.
        block: codes per block, 32 or 16.
        offset: the code of weight 0 where there is no minimum (Q4_0's 8, Q5_0's 16, Q6_K's 32, Q8_0's 128).
        bias: (out,) float added to the product (Qwen2's q/k/v), or None.
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        minimum: torch.Tensor | None,
        bits: int,
        block: int = BLOCK,
        offset: int = 0,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if bits not in BITS or block not in BLOCK_SIZES or codes.shape[1] % BLOCK:
            raise ValueError(
                f"blocks of 16 or 32 4-, 5-, 6- or 8-bit codes, {BLOCK} dividing the inputs; got {bits} bits, "
                f"blocks of {block} and {codes.shape[1]} inputs"
            )
        if scale.shape != (codes.shape[0], codes.shape[1] // block):
            raise ValueError(
                f"one scale per block of {block}: {tuple(scale.shape)} for codes {tuple(codes.shape)}"
            )
        self.bits, self.block, self.offset = bits, block, offset
        self.out_features, self.in_features = codes.shape
        self.register_buffer("words", pack_codes(codes, bits))
        self.register_buffer("scale", scale.t().contiguous().float())  # (in / block, out)
        self.register_buffer("minimum", None if minimum is None else minimum.t().contiguous().float())
        self.register_buffer("bias", bias)
        order = high_order(bits - 4) if bits in (5, 6) else []
        self._high = sorted(range(len(order)), key=order.__getitem__)  # code j's place among the high fields
        if codes.device.type == "cpu":
            row_product_op()  # loaded (or built) now: a compiled step's trace cannot build it

    def _apply(self, fn, recurse=True):
        converts_to = fn(torch.zeros(1, device=self.words.device)).dtype  # .half(), .to(torch.bfloat16)
        if converts_to != torch.float32:
            raise TypeError(
                "QuantizedLinear computes in float32: rounding its scales would change the weights"
            )
        return super()._apply(fn, recurse)

    def codes(self, outputs: slice = slice(None)) -> torch.Tensor:
        """The float codes less the offset, (in / block, block, outputs) (all outputs by default)."""
        words = self.words[..., outputs]
        if self.bits == 8:
            codes = _unpack(words, 8)
        else:
            codes = _unpack(words[:, :4], 4)
            if self.bits > 4:
                high = _unpack(words[:, 4:], self.bits - 4)
                codes = codes | (high[:, self._high] << 4)
        codes = codes.float().sub_(self.offset) if self.offset else codes.float()
        return codes.view(-1, self.block, codes.shape[-1])

    def dequantize(
        self, outputs: slice | torch.Tensor = slice(None), buffer: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The float32 weight (out, in), or its rows `outputs` (a slice, or indices: an embedding's lookup); in
        `buffer` (flat float32, large enough) if given and the C++ kernel runs."""
        kernel = isinstance(outputs, slice) and self.words.device.type == "cpu" and dequantize_op()
        if kernel:  # one pass over the words (row_kernel.cpp)
            start, stop, _ = outputs.indices(self.out_features)
            shape = (self.in_features, stop - start)
            fits = buffer is not None and buffer.numel() >= shape[0] * shape[1]
            weight = buffer[: shape[0] * shape[1]].view(shape) if fits else torch.empty(shape)
            kernel(self.words, self.scale, self.minimum, self.offset, start, weight)
            return weight.t()
        # In place: a prefill dequantises every matrix, so each pass over them counts.
        weight = self.codes(outputs).mul_(self.scale[:, None, outputs])
        if self.minimum is not None:
            weight.add_(self.minimum[:, None, outputs])
        return weight.view(self.in_features, -1).t()

    def row_slices(self) -> list[slice]:
        """Output rows in groups whose float weights take at most DEQUANTISED_BYTES: a product of many rows
        dequantises one group at a time, not the whole matrix (a 1 B model's output layer is 400 MB in float32,
        and its codes as many again while they are unpacked)."""
        step = max(1, DEQUANTISED_BYTES // (4 * self.in_features))
        return [slice(start, start + step) for start in range(0, self.out_features, step)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():  # training adapters on this frozen layer (QLoRA)
            y = _ThroughBlocks.apply(x, self)
            return y if self.bias is None else y + self.bias
        rows = x.shape[:-1].numel()
        if (
            rows <= KERNEL_ROWS
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and not x.requires_grad
            and row_product_op()
        ):
            y = row_product_op()(x, self.words, self.scale, self.minimum, self.offset)
            return y if self.bias is None else y + self.bias
        if rows != 1:
            y = _product(x, self)
            return y if self.bias is None else y + self.bias
        # The same sum in torch, block by block (which Inductor fuses): where the C++ kernel cannot run.
        blocks = x.float().reshape(-1, self.block, 1)
        y = (self.scale * (self.codes() * blocks).sum(1)).sum(0)
        if self.minimum is not None:
            y = y + (self.minimum * blocks.sum(1)).sum(0)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}, block={self.block}, offset={self.offset}"


class QuantizedEmbedding(nn.Module):
    """A token embedding whose table is a `QuantizedLinear`'s weight, a token's row its output row: a lookup
    dequantises the rows of its tokens only. A tied model's table is its output layer itself, so the file's one
    matrix is kept once, in blocks (a 1B-class Q4_K_M file's table was 400 MB in float32, the blocks 100 MB)."""

    def __init__(self, table: QuantizedLinear) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table.dequantize(idx.flatten()).reshape(*idx.shape, self.embedding_dim)


def _product(x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
    """x Wᵀ for many rows of x, W dequantised a group of output rows at a time."""
    buffer = _dequantise_buffer()
    return torch.cat(
        [F.linear(x, layer.dequantize(rows, buffer).to(x.dtype)) for rows in layer.row_slices()], -1
    )


_buffers = threading.local()


def _dequantise_buffer() -> torch.Tensor:
    """This thread's DEQUANTISED_BYTES of float32, which every product of many rows dequantises into in turn: a
    fresh buffer each time was ~40% of a QLoRA run's page faults (the kernel zero-fills each new page), or, kept
    by the allocator, memory the step no longer needed. Each use ends before the next (the products are
    synchronous on the CPU, and nothing saves W for a backward)."""
    if getattr(_buffers, "cpu", None) is None:
        _buffers.cpu = torch.empty(DEQUANTISED_BYTES // 4)
    return _buffers.cpu


class _ThroughBlocks(torch.autograd.Function):
    """`x Wᵀ` for a frozen `QuantizedLinear`, whose backward gives x its gradient from W dequantised again: saving
    each layer's float W for the backward would hold the whole float model, which keeping the blocks avoids."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
        ctx.layer = layer
        return _product(x, layer)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        layer = ctx.layer
        grad_x = None
        buffer = _dequantise_buffer()
        for rows in layer.row_slices():
            part = grad[..., rows] @ layer.dequantize(rows, buffer).to(grad.dtype)
            grad_x = part if grad_x is None else grad_x.add_(part)
        return grad_x, None
