"""Causal grouped-query self-attention: the fused SDPA kernel, and an explicit path that shows its work."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache import Cache
from .config import ModelConfig
from .norm import RMSNorm
from .rope import apply_rope


def causal_mask(t: int, s: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (T, S) mask, True where query i may see key j: the diagonal is aligned bottom-right.

    The T new queries are the last T of S positions, so query i sits at absolute position S - T + i.
    """
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, Hkv, S, D) with the fused kernel.

    `is_causal=True` aligns the triangle top-left, which is only right when T == S. So the three cases are
    handled apart (README "How attention works here", causal mask): T == S uses is_causal, a one-token
    decode needs no mask, and only chunked prefill pays for an explicit bottom-right mask. A static-shape cache passes
    `visible` (bool, broadcastable to (B, H, T, S)) because it hands over its whole buffer.
    """
    if visible is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    t, s = q.shape[2], k.shape[2]
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if t == 1:  # one new token sees every cached key: no mask
        return one_query_sdpa(q, k, v)
    mask = causal_mask(t, s, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def one_query_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of one query per head, q (B, H, 1, D), over every key of k, v (B, Hkv, S, D).

    Each key head's G = H / Hkv query heads become G query rows of that head, (B, Hkv, G, D): the kernel then
    reads every cached key once, where the CPU kernel under `enable_gqa` streams it once per query head. Query
    heads are grouped as in `enable_gqa`: head i uses key head i // G.
    """
    b, h, _, d = q.shape
    hkv = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, d), k, v)  # (B, Hkv, G, Dv)
    return out.reshape(b, h, 1, v.shape[-1])


def one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v for one query per head, q (B, H, 1, D), over k, v (B, Hkv, S, D), as products
    and sums for Inductor to fuse (the compiled CPU decode step: `Cache.reductions`).

    The fused CPU kernel is built for many queries; the fused reduction reads each cached key once on every
    thread (`python -m benchmarks.decode --batches 1 8 32` measures it). Run eagerly, the products would be
    materialised first: only the compiled step asks for it. `visible` is a bool mask (B or 1, 1, 1, S). Each
    key head serves its group of query heads without being repeated. Scores and probabilities are at least
    float32, as in the fused kernel, for bf16 and fp16 models.
    """
    b, h, _, d = q.shape
    hkv = k.shape[1]
    q = q.to(torch.promote_types(q.dtype, torch.float32))  # bf16/fp16 -> float32, float64 stays
    q = q.view(b, hkv, h // hkv, 1, d)  # (B, Hkv, G, 1, D): the query heads of each key head
    scores = (q * k.unsqueeze(2)).sum(-1) / d**0.5  # (B, Hkv, G, S)
    scores = scores.masked_fill(~visible.view(visible.shape[0], 1, 1, -1), float("-inf"))
    out = (scores.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(-2)  # (B, Hkv, G, Dv)
    return out.to(v.dtype).reshape(b, h, 1, v.shape[-1])


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled scores q kᵀ / sqrt(D) in float32, (B, H, T, S), with GQA key heads repeated per group."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, S, D)
    return (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook computation softmax(q kᵀ / sqrt(D) + mask) v in float32.

    Returns the output (B, H, T, D) in q's dtype and the probabilities (B, H, T, S). It materialises the
    full matrix, so it is for inspection and tests, never for training.
    """
    scores = attention_scores(q, k)
    mask = causal_mask(q.shape[2], k.shape[2], q.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, S, D)
    return (probs @ v.float()).to(q.dtype), probs


class CausalSelfAttention(nn.Module):
    """Fused QKV projection (biased for Qwen2), per-head q/k RMSNorm (Qwen3), RoPE, causal GQA attention and
    the output projection."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
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
        cache: Cache | None = None,
        probs_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With `probs_out`, the explicit path runs and appends its probabilities."""
        q, k, v = self.project(x, cos, sin)
        visible = None
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, Hkv, S, D)
            visible = cache.visible
        if probs_out is None and cache is not None and cache.reductions:
            y = one_query_attention(q, k, v, visible)
        elif probs_out is None:
            y = sdpa_attention(q, k, v, visible)
        else:
            y, probs = explicit_attention(q, k, v)
            probs_out.append(probs)
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)  # (B, T, H * D)
        return self.proj(y)
