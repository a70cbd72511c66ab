"""A preallocated key/value cache owned by the caller, not by the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .attention import Rope, sdpa_attention
from .config import ModelConfig


class LayerCache(Protocol):
    """What one block asks of a cache: its own layer, so a block never needs its index. `attend` stores the
    new keys and values (B, Hkv, T, D) and returns the attention (B, H, T, D) of q over everything held."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class Cache(Protocol):
    """What a forward asks of a cache: `KVCache` answers at an integer position, the static cache of the
    compiled step (generation/static_decode.py) at a tensor position, so one forward serves both."""

    def rope_rows(self, t: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def layers(self) -> Sequence[LayerCache]: ...  # one per block, in order

    def advance(self, n_tokens: int) -> None: ...


def cache_bytes(config: ModelConfig, positions: int, element_size: int) -> int:
    """Bytes the keys and values of `positions` positions of one sequence take across all layers: GQA/MQA keep
    n_kv_head heads of head_dim. The one rule for a cache's size, with nothing allocated."""
    return 2 * config.n_layer * config.n_kv_head * config.head_dim * positions * element_size


@dataclass(frozen=True)
class KVLayer:
    """Layer `layer` of a `KVCache`, at the cache's position."""

    cache: KVCache
    layer: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # The filled keys only, so the causal rule of `sdpa_attention` (the queries are the last positions) holds.
        k, v = self.cache.update(self.layer, k, v)
        return sdpa_attention(q, k, v)


@dataclass
class KVCache:
    """Keys and values of the n_kv_head heads of every layer for the tokens seen so far (GQA/MQA shrink it by
    n_head / n_kv_head). A layer writes [pos, pos + T) and reads [0, pos + T); the model then calls `advance`."""

    k: torch.Tensor  # (L, B, Hkv, max_len, D)
    v: torch.Tensor  # (L, B, Hkv, max_len, D)
    rope: Rope
    pos: int = 0

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """Zero-initialised buffers for `batch_size` sequences of up to `max_len` tokens."""
        if not 0 < max_len <= config.block_size:
            raise ValueError(f"KVCache max_len must be in 1..block_size ({config.block_size}), got {max_len}")
        shape = (config.n_layer, batch_size, config.n_kv_head, max_len, config.head_dim)
        dtype = dtype or torch.get_default_dtype()
        zeros = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2)]
        return cls(*zeros, rope=config.rope)

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, length: int | None = None) -> KVCache:
        """The cache of `model` on its device and in its dtype for `length` tokens, at most its block_size."""
        param, config = next(model.parameters()), model.config
        max_len = min(config.block_size, length or config.block_size)
        return cls.allocate(config, batch_size, max_len, device=param.device, dtype=param.dtype)

    def rope_rows(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, D) of the T new tokens, which sit at positions pos .. pos + T - 1."""
        return self.rope.tables(self.pos, t, self.k.device)

    def layers(self) -> list[KVLayer]:
        return [KVLayer(self, layer) for layer in range(self.k.shape[0])]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values (B, Hkv, T, D) of `layer` and return all of them, (B, Hkv, pos + T, D)."""
        self.check_room(k.shape[2])
        end = self.pos + k.shape[2]
        keys, values = self.k[layer], self.v[layer]  # (B, Hkv, max_len, D) views
        keys.narrow(2, self.pos, k.shape[2]).copy_(k)
        values.narrow(2, self.pos, k.shape[2]).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def check_room(self, n_tokens: int) -> None:
        """The one "full" error, for every writer of the cache (the compiled step's too)."""
        if self.pos + n_tokens > self.max_len:
            raise ValueError(
                f"KVCache is full: writing {n_tokens} token(s) at position {self.pos} exceeds max_len "
                f"{self.max_len}; allocate a longer cache or call reset()"
            )

    def advance(self, n_tokens: int) -> None:
        self.pos += n_tokens

    def rollback(self, pos: int) -> None:
        """Forget the positions from `pos` on (rejected drafts), zeroed as if those tokens had never been fed."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"KVCache.rollback position must be in 0..{self.pos}, got {pos}")
        self.k[:, :, :, pos : self.pos] = 0
        self.v[:, :, :, pos : self.pos] = 0
        self.pos = pos

    def reset(self) -> None:
        """Forget every position; the buffers are overwritten by the next prefill."""
        self.pos = 0
