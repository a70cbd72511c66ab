"""RMSNorm: the norm of every block, of the final layer and of Qwen3's per-head queries and keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Scale by the reciprocal root-mean-square of the features; no mean subtraction, no bias."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32: the same numbers as below in one call (a decode step is made of small ops, 2 norms a layer).
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalise in float32 and round before the scale (as Hugging Face Llama does) so bf16 runs and
        # exported models agree.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed
