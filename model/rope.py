"""Rotary position embeddings in the rotate-half (Llama / Hugging Face) convention."""

from __future__ import annotations

import torch


def rope_tables(
    head_dim: int, start: int, length: int, theta: float, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (length, head_dim) for absolute positions start..start+length-1, in float32.

    They are computed per forward rather than stored as buffers, so `model.to(torch.bfloat16)` cannot
    round the angles; the cost is a handful of tiny ops per call.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    positions = torch.arange(start, start + length, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # (T, D/2)
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
