"""A GGUF file's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K matrices as block codes, for `cpu_kernels.quantized.QuantizedLinear`.

The byte layouts are ggml's (ggml-common.h, ggml-quants.c); why the kept codes give bit for bit the `gguf`
package's weights is in docs/pretrained.md ("Keeping the blocks").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from cpu_kernels.quantized import BLOCK, QuantizedEmbedding, QuantizedLinear
from model import GPT


class Blocks(NamedTuple):
    """One matrix: unsigned codes (out, in), scale and minimum (out, in / block; minimum None where the type
    has an offset), bits, codes per block, the code of weight 0."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None
    bits: int
    block: int = BLOCK
    offset: int = 0


def read_blocks(data: np.ndarray, type_name: str) -> Blocks | None:
    """The blocks of a GGUF tensor's raw bytes (rows, bytes per row), or None for a type kept as float."""
    if type_name not in READERS:
        return None
    block_bytes, reader = READERS[type_name]
    return reader(torch.from_numpy(np.ascontiguousarray(data).reshape(data.shape[0], -1, block_bytes).copy()))


def dequantized(matrix: Blocks, rows: int = 1024) -> torch.Tensor:
    """The float32 weights (out, in) of `matrix`, `rows` at a time: the arithmetic of `QuantizedLinear.dequantize`
    (so the same bits as the `gguf` package's), without the whole matrix's float codes beside the result."""
    out_features, in_features = matrix.codes.shape
    weight = torch.empty(out_features, in_features)
    for start in range(0, out_features, rows):
        part = slice(start, start + rows)
        values = matrix.codes[part].reshape(-1, in_features // matrix.block, matrix.block).float()
        if matrix.offset:
            values.sub_(matrix.offset)
        values.mul_(matrix.scale[part, :, None])
        if matrix.minimum is not None:
            values.add_(matrix.minimum[part, :, None])
        weight[part] = values.view(-1, in_features)
    return weight


def _half(raw: torch.Tensor) -> torch.Tensor:
    """(rows, nb, 2) bytes -> (rows, nb, 1) float32 of the little-endian float16 they hold."""
    return raw.contiguous().view(torch.float16).float()


def _q8_0(raw: torch.Tensor) -> Blocks:
    rows = raw.shape[0]
    codes = raw[..., 2:].contiguous().view(torch.int8).reshape(rows, -1).to(torch.int16) + 128
    return Blocks(codes, _half(raw[..., 0:2])[..., 0], None, 8, BLOCK, 128)


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """(rows, nb, n) bytes -> (rows, nb, 8 n) bits, bit k of byte j at 8 j + k (a little-endian bit field)."""
    bits = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1
    return bits.reshape(*packed.shape[:-1], -1)


def _q4_or_q5(raw: torch.Tensor) -> Blocks:
    """Q4_0, Q4_1, Q5_0, Q5_1 (told apart by their block size): the low 4 bits of the codes in the last 16 bytes,
    Q5's fifth bits in the 4 bytes before; Q4_0's weight is d * (q - 8), Q5_0's d * (q - 16), without minimum."""
    rows, size, scale = raw.shape[0], raw.shape[-1], _half(raw[..., 0:2])[..., 0]
    bits = 4 if size <= READERS["Q4_1"][0] else 5
    packed = raw[..., -16:]
    codes = torch.cat([packed & 15, packed >> 4], dim=-1)
    if bits == 5:
        codes |= _bits(raw[..., -20:-16]) << 4
    if size in (READERS["Q4_0"][0], READERS["Q5_0"][0]):
        return Blocks(codes.reshape(rows, -1), scale, None, bits, BLOCK, 1 << (bits - 1))
    return Blocks(codes.reshape(rows, -1), scale, _half(raw[..., 2:4])[..., 0], bits)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(rows, nb, 128) bytes -> (rows, nb, 256) codes: each 32 bytes give 32 low nibbles, then 32 high ones."""
    chunks = packed.reshape(*packed.shape[:2], 4, 1, 32)
    return torch.cat([chunks & 15, chunks >> 4], dim=3).reshape(*packed.shape[:2], 256)


def _k_quant(raw: torch.Tensor, codes: torch.Tensor, bits: int) -> Blocks:
    """Q4_K / Q5_K (float16 `d` and `dmin`, 12 bytes of scales, then the codes): `codes` (rows, nb, 256) with
    their sub-block scales `d * sc` and minima `-(dmin * m)`. The 12 bytes hold sc 0-3 and m 0-3 in the low 6 bits
    of bytes 0-3 and 4-7; sc 4-7 and m 4-7 in the low and high nibbles of bytes 8-11, their top two bits in the top
    two bits of bytes 0-3 and 4-7."""
    packed = raw[..., 4:16].to(torch.int32)
    low, high, mixed = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (mixed & 15) | ((low >> 6) << 4)], dim=-1)
    m = torch.cat([high & 63, (mixed >> 4) | ((high >> 6) << 4)], dim=-1)
    scale, minimum = _half(raw[..., 0:2]) * sc.float(), -(_half(raw[..., 2:4]) * m.float())
    rows = raw.shape[0]
    return Blocks(codes.reshape(rows, -1), scale.reshape(rows, -1), minimum.reshape(rows, -1), bits)


def _q5_k(raw: torch.Tensor) -> Blocks:
    rows, nb = raw.shape[:2]
    # Q4_K with 32 bytes of fifth bits before the nibbles, (rows, nb, sub-block s, weight l): bit s of byte l
    fifth = _bits(raw[..., 16:48]).reshape(rows, nb, 32, 8).transpose(-1, -2)
    codes = _nibbles(raw[..., 48:]) | (fifth.reshape(rows, nb, 256) << 4)
    return _k_quant(raw, codes, 5)


def _q6_k(raw: torch.Tensor) -> Blocks:
    rows, nb = raw.shape[:2]
    # Each half of 128 weights: 64 bytes of low nibbles (weights 0-63, then 64-127) and 32 bytes of 2-bit highs
    # (weights l, 32 + l, 64 + l, 96 + l in bits 0-1, 2-3, 4-5, 6-7 of byte l); then 16 signed 8-bit scales of
    # 16 weights each and a float16 `d`.
    low = raw[..., 0:128].reshape(rows, nb, 2, 1, 64)
    low = torch.cat([low & 15, low >> 4], dim=3).reshape(rows, nb, 2, 128)
    high = raw[..., 128:192].reshape(rows, nb, 2, 1, 32) >> torch.arange(0, 8, 2, dtype=torch.uint8)[:, None]
    high = (high & 3).reshape(rows, nb, 2, 128)
    sc = raw[..., 192:208].contiguous().view(torch.int8).float()
    scale = (_half(raw[..., 208:210]) * sc).reshape(rows, -1)
    return Blocks((low | (high << 4)).reshape(rows, -1), scale, None, 6, 16, 32)


# Each kept type's bytes per block and the reader of its raw blocks (rows, blocks, bytes).
READERS = {
    "Q4_0": (18, _q4_or_q5),
    "Q4_1": (20, _q4_or_q5),
    "Q5_0": (22, _q4_or_q5),
    "Q5_1": (24, _q4_or_q5),
    "Q8_0": (34, _q8_0),
    "Q4_K": (144, lambda raw: _k_quant(raw, _nibbles(raw[..., 16:]), 4)),
    "Q5_K": (176, _q5_k),
    "Q6_K": (210, _q6_k),
}
KEPT_TYPES = tuple(READERS)  # what keep_quantized keeps, as user messages name them


def _widened(matrix: Blocks, block: int, offset: int | None) -> Blocks:
    """The same weights in blocks of `block` (no longer than its own), each scale and minimum repeated over the
    smaller blocks it spans; with `offset` None, a minimum for every block: `-offset * scale` where the type has
    an offset (exact, as `scale * q` has at most 24 significant bits for every type and code)."""
    repeat = matrix.block // block
    scale, minimum = matrix.scale.repeat_interleave(repeat, dim=1), matrix.minimum
    if offset is None:
        minimum = -matrix.offset * matrix.scale if minimum is None else minimum
        offset = 0
    minimum = None if minimum is None else minimum.repeat_interleave(repeat, dim=1)
    return Blocks(matrix.codes.to(torch.int16), scale, minimum, matrix.bits, block, offset)


def stacked(parts: list[Blocks | None]) -> Blocks | None:
    """Matrices stacked by rows into one fused layer, or None unless all are blocks. Parts of different types
    (Q4_K_M stores some layers' v or down as Q6_K) share the widest codes, the shortest blocks, and a minimum
    unless all have the same offset and none a minimum, so the fused layer holds the very weights of each part."""
    if any(p is None for p in parts):
        return None
    offsets = {p.offset if p.minimum is None else None for p in parts}
    offset = offsets.pop() if len(offsets) == 1 else None
    parts = [_widened(p, min(p.block for p in parts), offset) for p in parts]
    minimum = None if parts[0].minimum is None else torch.cat([p.minimum for p in parts])
    codes, scale = torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts])
    return Blocks(codes, scale, minimum, max(p.bits for p in parts), parts[0].block, parts[0].offset)


def matrices(model: GPT) -> list[str]:
    """Our names of the matrices a GGUF may keep in blocks: the embedding and each linear layer's weight (a tied
    lm_head is the embedding)."""
    names = [
        f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
    ]
    if model.config.tie_embeddings:
        names.remove("lm_head.weight")
    return ["wte.weight", *names]


def keep_blocks(model: GPT, blocks: dict[str, Blocks]) -> None:
    """Replace the layers whose weight is in `blocks` (our names, rows in rotate-half order) by `QuantizedLinear`s,
    each keeping the layer's bias; the embedding by a `QuantizedEmbedding`, whose table a tied lm_head shares."""
    for name, matrix in blocks.items():
        if name == "wte.weight":
            model.wte = QuantizedEmbedding(QuantizedLinear(*matrix))
            if model.config.tie_embeddings:
                model.lm_head = model.wte.table
            continue
        parent, _, child = name.removesuffix(".weight").rpartition(".")
        module = model.get_submodule(parent) if parent else model
        bias = getattr(module, child).bias
        setattr(module, child, QuantizedLinear(*matrix, bias=None if bias is None else bias.detach()))
