"""The steps of one attention head on real input, for teaching: raw scores, masked scores, probabilities."""

from __future__ import annotations

import torch

from common.errors import UserError
from model.attention import attention_scores, causal_mask
from model.gpt import GPT
from model.rope import rope_tables


@torch.no_grad()
def attention_steps(model: GPT, idx: torch.Tensor, layer: int, head: int) -> dict[str, torch.Tensor]:
    """For idx (1, T): the scaled scores q·kᵀ/sqrt(D), the same with -inf above the diagonal, and softmax.

    Each is a float32 (T, T) matrix taken from the model's own projections at `layer`, `head`.
    """
    config = model.config
    if not 0 <= layer < config.n_layer:
        raise UserError(f"layer must be in 0..{config.n_layer - 1}, got {layer}")
    if not 0 <= head < config.n_head:
        raise UserError(f"head must be in 0..{config.n_head - 1}, got {head}")
    t = idx.shape[1]
    cos, sin = rope_tables(config.head_dim, 0, t, config.rope_theta, idx.device)
    x = model.wte(idx)  # (1, T, C)
    for block in model.blocks[:layer]:
        x = block(x, cos, sin)
    attn = model.blocks[layer].attn
    q, k, _ = attn.project(model.blocks[layer].attn_norm(x), cos, sin)
    scores = attention_scores(q, k)[0, head]  # (T, T)
    masked = scores.masked_fill(~causal_mask(t, t, idx.device), float("-inf"))
    return {"scores": scores, "masked": masked, "probs": masked.softmax(dim=-1)}
