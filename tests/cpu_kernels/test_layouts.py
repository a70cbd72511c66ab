"""The C++ library's weight layouts (cpu_kernels/row_kernel.cpp): its dequantised weights are torch's unpacking
of the same words and its packed codes torch's packing, bit for bit, so every path sees the same weights."""

from __future__ import annotations

import pytest
import torch

from cpu_kernels import library as row_kernel
from cpu_kernels.quantized import pack_codes
from tests.cpu_kernels.test_row_kernel import KINDS, kernel, random_layer


@pytest.mark.parametrize("bits, with_minimum, out, inp, block", KINDS)
def test_the_kernel_dequantises_what_torch_unpacks_bit_for_bit(
    monkeypatch, bits, with_minimum, out, inp, block
):
    """Products of many rows (prefills, QLoRA) take the kernel's weights, the other paths torch's unpacking: they
    must be the same floats. Groups off the vectors' multiples reach the scalar tail; a reused buffer too."""
    kernel()
    layer = random_layer(bits, with_minimum, out, inp, block)
    groups = [slice(None), slice(3, out - 5), slice(out - 1, out)]
    buffer = torch.full((out * inp + 7,), float("nan"))
    kernels = [(layer.dequantize(rows), layer.dequantize(rows, buffer).clone()) for rows in groups]
    monkeypatch.setattr(row_kernel, "_loaded", {"op": None})
    for rows, (fresh, in_buffer) in zip(groups, kernels, strict=True):
        unpacked = layer.dequantize(rows)
        assert torch.equal(fresh, unpacked) and torch.equal(in_buffer, unpacked), rows


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("out", [3, 300])  # one row, and more than PACK_ROWS (torch packs in groups of them)
def test_the_kernel_packs_the_codes_as_torch_does(monkeypatch, bits, out):
    kernel()
    codes = torch.randint(0, 2**bits, (out, 96), generator=torch.Generator().manual_seed(3))
    packed = pack_codes(codes, bits)
    monkeypatch.setattr(row_kernel, "_loaded", {"op": None})
    assert packed.dtype == torch.int32 and torch.equal(packed, pack_codes(codes, bits))
