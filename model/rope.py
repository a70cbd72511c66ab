"""Rotary position embeddings in the rotate-half (Llama / Hugging Face) convention, with Llama 3's scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch


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
    """The rotation a model applies, enough to build its cos/sin tables on any device.

    Frozen and hashable, so a cache can hold it and the tables it builds are shared per (rope, device).
    """

    head_dim: int
    theta: float
    llama3: Llama3Scaling | None = None

    def tables(
        self, start: int, length: int, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (length, head_dim) for absolute positions start..start+length-1, in float32."""
        return rope_tables(self.head_dim, start, length, self.theta, device, self.llama3)


def inverse_frequencies(head_dim: int, theta: float, llama3: Llama3Scaling | None = None) -> torch.Tensor:
    """The D/2 rotation speeds theta^(-2i/D) (radians per position), rescaled by Llama 3's rule if given."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return inv_freq if llama3 is None else llama3.rescale(inv_freq)


@lru_cache(maxsize=32)
def _tables(
    head_dim: int, length: int, theta: float, device: torch.device, llama3: Llama3Scaling | None
) -> tuple[torch.Tensor, torch.Tensor]:
    # Plain float32 tensors, not module buffers, so `model.to(torch.bfloat16)` cannot round the angles. Built
    # outside inference mode because inference tensors cannot be saved for a later backward pass.
    with torch.inference_mode(False), torch.no_grad():
        inv_freq = inverse_frequencies(head_dim, theta, llama3).to(device)
        angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)  # (T, D/2)
        # Rotate-half pairs dimension i with i + D/2, so each frequency appears twice, once per half.
        angles = torch.cat([angles, angles], dim=-1)  # (T, D)
        return angles.cos(), angles.sin()


def rope_tables(
    head_dim: int,
    start: int,
    length: int,
    theta: float,
    device: torch.device | str | None = None,
    llama3: Llama3Scaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (length, head_dim) for absolute positions start..start+length-1, in float32.

    Tables are cached per device for lengths rounded up to a power of two, so a decode step only slices.
    """
    size = 1 << (start + length - 1).bit_length()  # a power of two >= start + length: few distinct tables
    cos, sin = _tables(head_dim, size, float(theta), torch.device(device or "cpu"), llama3)
    return cos[start : start + length], sin[start : start + length]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by tables already made for its positions, cos/sin (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # The product runs in float32 so bf16 activations do not lose the small-angle precision.
    out = x.float() * cos + rotated.float() * sin
    return out.to(x.dtype)
