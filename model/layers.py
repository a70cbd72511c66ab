"""The pieces of a pre-norm Llama block: RMSNorm, SwiGLU MLP and the block itself."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import CausalSelfAttention
from .cache import Cache
from .config import ModelConfig


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


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.n_embd, 2 * config.hidden_dim, bias=False)
        self.down = nn.Linear(config.hidden_dim, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)
        # Identity when p == 0 spares two no-op calls per block in every decode step.
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: Cache | None = None,
        probs_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, cache, probs_out))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))
