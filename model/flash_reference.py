"""FlashAttention written out in plain PyTorch, to read rather than to run fast: the same output as
`model.attention.sdpa_attention`, computed one tile at a time without ever storing the (T, S) scores.

Per query tile, keys and values are visited in tiles, and each query row keeps three running quantities: the
largest score so far `m`, the denominator `l = sum exp(score - m)` and the unnormalised output
`acc = sum exp(score - m) v`. The max keeps exp() from overflowing (float32 overflows past ~88). When a tile
raises the max from m to m', exp(score - m) * exp(m - m') = exp(score - m'), so multiplying `l` and `acc` by
exp(m - m') puts the old terms on the new scale exactly. Tiles wholly above the causal diagonal are skipped,
and `acc / l` is taken once at the end. Causality follows `causal_mask` (query i is at position S - T + i).
"""

from __future__ import annotations

import math

import torch


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size_q: int = 64, block_size_k: int = 64
) -> torch.Tensor:
    """Causal GQA attention of q (B, H, T, D) over k, v (B, Hkv, S, D), tiled, accumulated in float32;
    returns (B, H, T, D) in q's dtype."""
    _check_shapes(q, k, v, block_size_q, block_size_k)
    b, h, t, d = q.shape
    n_kv_head, s = k.shape[1], k.shape[2]
    group = h // n_kv_head
    # Query head h uses kv head h // group (as repeat_interleave), so H splits into (Hkv, group) and K/V get a
    # size-1 group axis that broadcasts.
    q_grouped = q.reshape(b, n_kv_head, group, t, d)  # (B, Hkv, G, T, D)
    k_grouped = k.unsqueeze(2)  # (B, Hkv, 1, S, D)
    v_grouped = v.unsqueeze(2)  # (B, Hkv, 1, S, D)
    out = torch.empty(b, n_kv_head, group, t, d, dtype=torch.float32, device=q.device)
    for q_start in range(0, t, block_size_q):
        q_end = min(q_start + block_size_q, t)
        q_tile = q_grouped[..., q_start:q_end, :].float()  # (B, Hkv, G, Tq, D)
        first_pos = s - t + q_start  # absolute position of the tile's first query
        out[..., q_start:q_end, :] = _attend_query_tile(q_tile, k_grouped, v_grouped, first_pos, block_size_k)
    return out.reshape(b, h, t, d).to(q.dtype)  # (B, H, T, D)


def _attend_query_tile(
    q_tile: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_pos: int, block_size_k: int
) -> torch.Tensor:
    """Online-softmax attention of one query tile (B, Hkv, G, Tq, D) whose first query is at `first_pos`."""
    tq = q_tile.shape[-2]
    scale = 1.0 / math.sqrt(q_tile.shape[-1])
    query_pos = torch.arange(first_pos, first_pos + tq, device=q_tile.device)  # (Tq,)
    row_shape = (*q_tile.shape[:-1], 1)  # (B, Hkv, G, Tq, 1)
    running_max = torch.full(row_shape, float("-inf"), device=q_tile.device)
    running_sum = torch.zeros(row_shape, device=q_tile.device)
    acc = torch.zeros(q_tile.shape, device=q_tile.device)  # (B, Hkv, G, Tq, D)
    last_visible_key = first_pos + tq - 1  # key tiles after it lie above the diagonal: never loaded
    for k_start in range(0, last_visible_key + 1, block_size_k):
        k_end = min(k_start + block_size_k, last_visible_key + 1)
        k_tile = k[..., k_start:k_end, :].float()  # (B, Hkv, 1, Tk, D)
        v_tile = v[..., k_start:k_end, :].float()  # (B, Hkv, 1, Tk, D)
        scores = (q_tile @ k_tile.transpose(-2, -1)) * scale  # (B, Hkv, G, Tq, Tk)
        if k_end - 1 > first_pos:  # the tile crosses the diagonal: some rows may not see its last keys
            key_pos = torch.arange(k_start, k_end, device=q_tile.device)  # (Tk,)
            scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
        # Every row sees key 0, in the first tile: new_max is finite, so exp(-inf - new_max) is 0, not NaN.
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        rescale = torch.exp(running_max - new_max)  # exp(m - m'): puts old terms on the new max's scale
        weights = torch.exp(scores - new_max)  # unnormalised softmax numerators of this tile
        running_sum = running_sum * rescale + weights.sum(dim=-1, keepdim=True)
        acc = acc * rescale + weights @ v_tile
        running_max = new_max
    return acc / running_sum  # normalise once, after every key has been seen


def _check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size_q: int, block_size_k: int
) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(
            f"expected q (B, H, T, D) and k, v (B, Hkv, S, D), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must agree on batch and head_dim, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"n_head ({q.shape[1]}) must be divisible by n_kv_head ({k.shape[1]})")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"query length T ({q.shape[2]}) must not exceed key length S ({k.shape[2]})")
    if block_size_q <= 0 or block_size_k <= 0:
        raise ValueError(f"block sizes must be positive, got {block_size_q} and {block_size_k}")
