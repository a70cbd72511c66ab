"""Causal attention without parameters: RoPE (rotate-half, as Llama and Hugging Face, with Llama 3's scaling),
the fused-kernel path and the explicit path that shows its work."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3's RoPE rescaling: a frequency whose wavelength (2 pi / frequency) exceeds original_context /
    low_freq_factor turned less than once in training and is divided by `factor`; one shorter than
    original_context / high_freq_factor is kept; in between, the two are blended."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: int

    def rescale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        wavelen = 2 * math.pi / inv_freq
        # 0 where the wavelength is long (fully slowed), 1 where it is short (kept), linear in 1/wavelength.
        kept = (self.original_context / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        kept = kept.clamp(0.0, 1.0)
        return (1 - kept) * inv_freq / self.factor + kept * inv_freq


@dataclass(frozen=True)
class Rope:
    """The rotation a model applies; hashable, so its cos/sin tables are shared per (rope, device)."""

    head_dim: int
    theta: float
    llama3: Llama3Scaling | None = None

    def tables(
        self, start: int, length: int, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (length, head_dim) in float32 for positions start..start+length-1: a slice of a cached
        table whose length is a power of two, so a decode step only slices."""
        size = 1 << (start + length - 1).bit_length()
        cos, sin = _tables(self, size, torch.device(device or "cpu"))
        return cos[start : start + length], sin[start : start + length]


def inverse_frequencies(head_dim: int, theta: float, llama3: Llama3Scaling | None = None) -> torch.Tensor:
    """The D/2 rotation speeds theta^(-2i/D) (radians per position), rescaled by Llama 3's rule if given."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return inv_freq if llama3 is None else llama3.rescale(inv_freq)


@lru_cache(maxsize=32)
def _tables(rope: Rope, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Plain float32 tensors, not module buffers, so `model.to(torch.bfloat16)` cannot round the angles. Built
    # outside inference mode because inference tensors cannot be saved for a later backward pass.
    with torch.inference_mode(False), torch.no_grad():
        inv_freq = inverse_frequencies(rope.head_dim, rope.theta, rope.llama3).to(device)
        angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)  # (T, D/2)
        # Rotate-half pairs dimension i with i + D/2, so each frequency appears twice, once per half.
        angles = torch.cat([angles, angles], dim=-1)  # (T, D)
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by tables already made for its positions, cos/sin (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # The product runs in float32 so bf16 activations do not lose the small-angle precision.
    out = x.float() * cos + rotated.float() * sin
    return out.to(x.dtype)


def causal_mask(t: int, s: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (T, S), True where query i (at position S - T + i: the T queries are the last T) may see key j."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, Hkv, S, D) with the fused kernel; the T queries are
    the last T positions.

    `is_causal=True` aligns the triangle top-left, right only when T == S; one query needs no mask; only a
    chunked prefill pays for the bottom-right mask.
    """
    t, s = q.shape[2], k.shape[2]
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if t == 1:
        # The G = H / Hkv query heads of each key head become G query rows of it (head i uses key head i // G,
        # as in enable_gqa): the kernel reads each cached key once, not once per query head as under enable_gqa.
        b, h, _, d = q.shape
        out = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], h // k.shape[1], d), k, v)
        return out.reshape(b, h, 1, v.shape[-1])
    mask = causal_mask(t, s, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled scores q kᵀ / sqrt(D) in float32, (B, H, T, S), with GQA key heads repeated per group."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, S, D)
    return (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook softmax(q kᵀ / sqrt(D) + mask) v in float32: the output (B, H, T, D) in q's dtype and the
    probabilities (B, H, T, S). It materialises the full matrix: for inspection and tests, never training."""
    scores = attention_scores(q, k)
    mask = causal_mask(q.shape[2], k.shape[2], q.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, S, D)
    return (probs @ v.float()).to(q.dtype), probs
