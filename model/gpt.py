"""The decoder-only transformer: RMSNorm, the attention layer, the SwiGLU MLP, the pre-norm block and the GPT.
The attention math and RoPE are in model/attention.py."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import apply_rope, explicit_attention, sdpa_attention
from .cache import Cache, LayerCache
from .config import ModelConfig


class RMSNorm(nn.Module):
    """Scale by the reciprocal root-mean-square of the features; no mean subtraction, no bias."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the same numbers as below in one call: fewer ops per decode step
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalise in float32 and round before the scale (as Hugging Face Llama does) so bf16 runs and
        # exported models agree.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed


class CausalSelfAttention(nn.Module):
    """Fused QKV projection (biased for Qwen2), per-head q/k RMSNorm (Qwen3), RoPE, causal GQA attention and
    the output projection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.qkv = nn.Linear(
            config.n_embd, (config.n_head + 2 * config.n_kv_head) * config.head_dim, bias=config.qkv_bias
        )
        # One gain per head dimension, shared by every head and position: it bounds the attention logits.
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.proj = nn.Linear(config.n_head * config.head_dim, config.n_embd, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, D) and keys/values (B, Hkv, T, D) of x (B, T, C), RoPE applied to q and k."""
        b, t, _ = x.shape
        h, hkv = self.n_head, self.n_kv_head
        qkv = self.qkv(x).view(b, t, h + 2 * hkv, self.head_dim).transpose(1, 2)  # (B, H + 2 Hkv, T, D)
        qk = qkv[:, : h + hkv]
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3 normalises before rotating
            qk = torch.cat([self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])], dim=1)
        qk = apply_rope(qk, cos, sin)  # q and k rotated in one call: fewer ops per decode step
        return qk[:, :h], qk[:, h:], qkv[:, h + hkv :]  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: LayerCache | None = None,
        probs_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With `probs_out`, the explicit path runs and appends its probabilities; with
        a cache, the cache writes the new keys and values and attends over all it holds."""
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            y = cache.attend(q, k, v)
        elif probs_out is not None:
            y, probs = explicit_attention(q, k, v)
            probs_out.append(probs)
        else:
            y = sdpa_attention(q, k, v)
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)  # (B, T, H * D)
        return self.proj(y)


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

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)
        # Identity when p == 0 spares two no-op calls per block in every decode step.
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: LayerCache | None = None,
        probs_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, cache, probs_out))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class GPT(nn.Module):
    """A Llama-style GPT: pre-norm RMSNorm, RoPE, SwiGLU, causal GQA attention; no biases unless `qkv_bias`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.rope = config.rope  # built once: a forward without a cache reads its tables
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights, zero biases, unit norm gains; the residual projections get init_std /
        sqrt(2 * n_layer) so the stream's variance does not grow with depth (GPT-2's scheme)."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.down):
                nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def forward(
        self,
        idx: torch.Tensor,
        cache: Cache | None = None,
        *,
        last_only: bool = False,
        probs_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T) placed after the tokens the cache holds (a `KVCache`, or
        the static cache of the compiled step), the one walk through the blocks for both.

        `last_only=True` gives (B, 1, V): a prefill that only picks the next token skips the LM head elsewhere
        (a quarter of a 512-token prefill at V=32000). `probs_out` collects the explicit path's probabilities.
        """
        t = idx.shape[1]
        if cache is None:
            if t > self.config.block_size:
                raise ValueError(
                    f"sequence of {t} tokens exceeds block_size {self.config.block_size}; "
                    "crop the input or use generate(), which slides the context"
                )
            cos, sin = self.rope.tables(0, t, idx.device)  # (T, D)
            layers = [None] * len(self.blocks)
        else:
            cos, sin = cache.rope_rows(t)  # (T, D) at the cache's position
            layers = cache.layers()
        x = self.dropout(self.wte(idx))  # (B, T, C)
        for block, layer in zip(self.blocks, layers, strict=True):
            x = block(x, cos, sin, layer, probs_out)
        if cache is not None:
            cache.advance(t)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))  # (B, T, V), or (B, 1, V) with last_only

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> torch.Tensor:
        """Softmax probabilities (L, B, H, T, T) of every layer and head, from the explicit path (no cache; call
        it in eval mode if dropout is on)."""
        probs: list[torch.Tensor] = []
        self.forward(idx, last_only=True, probs_out=probs)
        return torch.stack(probs)

    def num_params(self) -> int:
        """Parameter count, a tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())
