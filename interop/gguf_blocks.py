"""A GGUF file's Q4_0, Q4_1 and Q8_0 matrices as block codes, for `model.quantized.QuantizedLinear`.

`interop.load(..., keep_quantized=True)` replaces each linear layer whose weight the file stores in one of
these types by a `QuantizedLinear` of the same codes, so the float32 copy is dropped. The byte layouts
(ggml's `block_q4_0`, `block_q4_1`, `block_q8_0`, 32 weights a block): a float16 scale `d`, for Q4_1 a float16
minimum `m`, then the codes. 4-bit codes come two to a byte, weight j in the low nibble of byte j and weight
j + 16 in its high nibble; Q4_0's weight is `d * (q - 8)`, Q4_1's `d * q + m`, Q8_0's `d * q` with q signed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from model import GPT
from model.quantized import QuantizedLinear

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


class Blocks(NamedTuple):
    """One matrix: codes (out, in), scale and minimum (out, in / 32; minimum None for Q8_0), bits."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None
    bits: int

    def rows(self, fn) -> Blocks:
        """The same matrix with `fn` applied to the rows of codes, scale and minimum alike."""
        minimum = None if self.minimum is None else fn(self.minimum)
        return Blocks(fn(self.codes), fn(self.scale), minimum, self.bits)


def read_blocks(data: np.ndarray, type_name: str) -> Blocks | None:
    """The blocks of a GGUF tensor's raw bytes (rows, bytes per row), or None for a type kept as float."""
    if type_name not in BLOCK_BYTES:
        return None
    rows = data.shape[0]
    raw = np.ascontiguousarray(data).reshape(rows, -1, BLOCK_BYTES[type_name])  # (rows, nb, bytes)
    scale = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    if type_name == "Q8_0":
        codes = torch.from_numpy(raw[..., 2:].copy().view(np.int8)).reshape(rows, -1)
        return Blocks(codes, scale, None, 8)
    start = 2 if type_name == "Q4_0" else 4
    packed = torch.from_numpy(raw[..., start:].copy())  # (rows, nb, 16)
    codes = torch.cat([packed & 15, packed >> 4], dim=-1).reshape(rows, -1)
    if type_name == "Q4_0":
        minimum = -8 * scale  # d * (q - 8) == d * q - 8 d, both exact in float32
    else:
        minimum = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    return Blocks(codes, scale, minimum, 4)


def stacked(parts: list[Blocks | None]) -> Blocks | None:
    """Matrices stacked by rows into one fused layer, or None unless all are blocks of the same kind."""
    first = parts[0]
    if any(p is None or p.bits != first.bits for p in parts):
        return None
    minimum = None if first.minimum is None else torch.cat([p.minimum for p in parts])
    return Blocks(
        torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]), minimum, first.bits
    )


def linear_weights(model: GPT) -> list[str]:
    """Our names of the weights of the model's linear layers (a tied lm_head reads the embedding's)."""
    names = [
        f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
    ]
    return ["wte.weight" if n == "lm_head.weight" and model.config.tie_embeddings else n for n in names]


def keep_blocks(model: GPT, blocks: dict[str, Blocks]) -> None:
    """Replace the linear layers whose weight is in `blocks` (our names, rows in rotate-half order) by
    `QuantizedLinear`s; the embedding itself stays float32, as a step reads only its token's row."""
    for name, matrix in blocks.items():
        layer = "lm_head" if name == "wte.weight" else name.removesuffix(".weight")
        parent, _, child = layer.rpartition(".")
        module = model.get_submodule(parent) if parent else model
        setattr(module, child, QuantizedLinear(matrix.codes, matrix.scale, matrix.minimum, matrix.bits))
