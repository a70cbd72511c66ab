"""The computations of causal attention, with no parameters: RoPE (rotate-half, the Llama / Hugging Face
convention, with Llama 3's scaling), the fused-kernel path, the one-query paths of decoding, and the explicit
path that shows its work. The layer holding the projections is `CausalSelfAttention` in model/gpt.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3's RoPE rescaling: the low frequencies slowed down by `factor`, the high ones kept.

    A frequency's wavelength (2 pi / frequency, in positions) is compared with the context the model was first
    trained at: longer than original_context / low_freq_factor, it turned less than once there and is divided
    by `factor`; shorter than original_context / high_freq_factor, it is kept; in between, the two are blended.
    """

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
    """The rotation a model applies, enough to build its cos/sin tables on any device. Frozen and hashable, so
    a cache can hold it and its tables are shared per (rope, device)."""

    head_dim: int
    theta: float
    llama3: Llama3Scaling | None = None

    def tables(
        self, start: int, length: int, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (length, head_dim) for absolute positions start..start+length-1, in float32.

        Tables are cached per device for lengths rounded up to a power of two, so a decode step only slices.
        """
        size = 1 << (start + length - 1).bit_length()  # a power of two >= start + length: few distinct tables
        cos, sin = _tables(self, size, torch.device(device or "cpu"))
        return cos[start : start + length], sin[start : start + length]


def rope_tables(
    head_dim: int,
    start: int,
    length: int,
    theta: float,
    device: torch.device | str | None = None,
    llama3: Llama3Scaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Rope(head_dim, theta, llama3).tables(start, length, device)`."""
    return Rope(head_dim, float(theta), llama3).tables(start, length, device)


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
