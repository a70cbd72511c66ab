"""The steps of one attention head on real input, for teaching: raw scores, masked scores, probabilities."""

from __future__ import annotations

import torch

from model.attention import attention_scores, causal_mask
from model.gpt import GPT


@torch.no_grad()
def attention_steps(model: GPT, idx: torch.Tensor, layer: int, head: int) -> dict[str, torch.Tensor]:
    """For idx (1, T): the scaled scores q·kᵀ/sqrt(D), the same with -inf above the diagonal, and softmax.

    Each is a float32 (T, T) matrix from the model's own projections at `layer`, `head` (checked by the
    caller): a hook records what the forward hands that attention layer (its normed input and RoPE rows).
    """
    attn = model.blocks[layer].attn
    inputs: list[tuple] = []
    hook = attn.register_forward_pre_hook(lambda _, args: inputs.append(args[:3]))  # (x, cos, sin)
    try:
        model(idx, last_only=True)
    finally:
        hook.remove()
    q, k, _ = attn.project(*inputs[0])
    t = idx.shape[1]
    scores = attention_scores(q, k)[0, head]  # (T, T)
    masked = scores.masked_fill(~causal_mask(t, t, idx.device), float("-inf"))
    return {"scores": scores, "masked": masked, "probs": masked.softmax(dim=-1)}


STEP_TITLES = {
    "scores": "1. scaled scores q·kᵀ / sqrt(d)  (row = query token, column = key token)",
    "masked": "2. causal mask: a token may not look at later tokens (-inf above the diagonal)",
    "probs": "3. softmax over each row: attention probabilities (each row sums to 1)",
}


def steps_as_text(steps: dict[str, torch.Tensor], labels: list[str], width: int = 8) -> str:
    """The three matrices of `attention_steps` as titled text tables, one token label per row and column."""
    return "\n".join(f"\n{title}\n{_matrix(steps[key], labels, width)}" for key, title in STEP_TITLES.items())


def _matrix(values: torch.Tensor, labels: list[str], width: int) -> str:
    rows = [" " * width + "".join(f"{label:>{width}}" for label in labels)]
    for label, row in zip(labels, values.tolist(), strict=True):
        cells = "".join(f"{'-inf' if v == float('-inf') else f'{v:.3f}':>{width}}" for v in row)
        rows.append(f"{label:>{width}}{cells}")
    return "\n".join(rows)
