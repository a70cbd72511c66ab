"""One-row linear layers and one-query attention written as multiplies and sums, for Inductor to fuse on the CPU.

The compiled decode step (model/static_decode.py) runs under `ReductionKernels` on the CPU: Inductor fuses the
products and sums into reductions that read each weight or cached key once on every thread. Torch's
matrix-vector product reads a weight that does not fit in cache at about the bandwidth of one core, and the
fused attention kernel is built for many queries, not one (`python -m benchmarks.decode_vs_hf` and
`python -m benchmarks.decode --batches 1 8 32` measure them). Eager decoding, prefill and training keep the
matrix products and SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class ReductionKernels(TorchFunctionMode):
    """Writes a one-row `F.linear` and a one-query masked attention as multiplies and sums, for Inductor to fuse.

    Only meant inside a compiled step: run eagerly, the products would be materialised before the sums.
    A linear layer of more than one row keeps the matrix product, where the GEMM kernel is the better choice.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not kwargs and 2 <= len(args) <= 3:
            x, weight = args[:2]
            bias = args[2] if len(args) == 3 else None
            if x.shape[:-1].numel() == 1:
                out = (x.unsqueeze(-2) * weight).sum(-1)
                return out if bias is None else out + bias
        if func is F.scaled_dot_product_attention and len(args) == 3 and args[0].shape[2] == 1:
            mask = kwargs.get("attn_mask")
            if (
                kwargs.keys() == {"attn_mask", "enable_gqa"}
                and kwargs["enable_gqa"] is True
                and mask is not None
                and mask.dtype == torch.bool
                and mask.dim() == 4
                and mask.shape[1:3] == (1, 1)
            ):
                return one_query_attention(*args, mask)
        return func(*args, **kwargs)


def one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v for one query per head, q (B, H, 1, D), over k, v (B, Hkv, S, D).

    `visible` is a bool mask (B or 1, 1, 1, S). Each key head serves its group of query heads without being
    repeated. Scores and probabilities are at least float32, as in the fused kernel, for bf16 and fp16 models.
    """
    b, h, _, d = q.shape
    hkv = k.shape[1]
    q = q.to(torch.promote_types(q.dtype, torch.float32))  # bf16/fp16 -> float32, float64 stays
    q = q.view(b, hkv, h // hkv, 1, d)  # (B, Hkv, G, 1, D): the query heads of each key head
    scores = (q * k.unsqueeze(2)).sum(-1) / d**0.5  # (B, Hkv, G, S)
    scores = scores.masked_fill(~visible.view(visible.shape[0], 1, 1, -1), float("-inf"))
    out = (scores.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(-2)  # (B, Hkv, G, Dv)
    return out.to(v.dtype).reshape(b, h, 1, v.shape[-1])
