"""Per-head scalars that summarise attention maps, so heads can be searched and compared over training.

Every statistic takes softmax probabilities `probs` of shape (B, H, T, T) or (L, B, H, T, T) from
`GPT.attention_maps` (causal, each row sums to 1), averages over the batch and the query rows it uses, and
returns one number per head: a tensor (H,) or (L, H).
"""

from __future__ import annotations

import torch

STATISTICS = ("entropy", "sink_mass", "previous_token", "induction")  # what head_statistics returns, in order


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over query rows of the row entropy -sum p log p, in nats (0 log 0 = 0).

    0 means every row puts all its weight on one key; a uniform causal head scores mean_t log(t + 1).
    """
    _check_probs(probs, min_len=1)
    per_row = -torch.special.xlogy(probs.float(), probs.float()).sum(dim=-1)  # (..., B, H, T)
    return _mean_over_rows_and_batch(per_row)


def sink_mass(probs: torch.Tensor) -> torch.Tensor:
    """Mean weight on key 0 (the attention sink), over query rows t >= 1.

    Row 0 is skipped because causality forces it to put weight 1 on key 0, whatever the head does.
    """
    _check_probs(probs, min_len=2)
    return _mean_over_rows_and_batch(probs[..., 1:, 0].float())  # (..., B, H, T - 1) -> (..., H)


def previous_token_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean weight on key t - 1 over query rows t >= 1 (row 0 has no previous token)."""
    _check_probs(probs, min_len=2)
    previous = probs.diagonal(offset=-1, dim1=-2, dim2=-1).float()  # (..., B, H, T - 1): p[t, t - 1]
    return _mean_over_rows_and_batch(previous)


def induction_score(probs: torch.Tensor, period: int) -> torch.Tensor:
    """Mean weight an induction head would use, on a sequence whose tokens repeat with `period`.

    A query t >= period holds the same token as position t - period; an induction head looks up that earlier
    occurrence and attends to the token that followed it, key t - period + 1, to predict what comes next.
    Rows t < period have no earlier occurrence and are skipped.
    """
    if period < 1:
        raise ValueError(f"induction period must be at least 1, got {period}")
    _check_probs(probs, min_len=period + 1)
    # Offset -(period - 1) holds p[t, t - period + 1] for rows t >= period - 1; the first of them is
    # still in the first copy, so drop it: (..., B, H, T - period).
    followers = probs.diagonal(offset=1 - period, dim1=-2, dim2=-1)[..., 1:].float()
    return _mean_over_rows_and_batch(followers)


def repeated_random_tokens(
    vocab_size: int, period: int, batch: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Token ids (batch, 2 * period): a uniformly random segment of `period` tokens followed by itself.

    Random tokens carry no n-gram statistics a model could have learned, so attending to the follower of the
    earlier occurrence is the only way to predict the second copy: that is what `induction_score` measures.
    """
    segment = torch.randint(vocab_size, (batch, period), generator=generator)  # (B, period)
    return torch.cat([segment, segment], dim=1)  # (B, 2 * period)


def head_statistics(
    model: torch.nn.Module,
    probe_ids: torch.Tensor,
    induction_period: int,
    induction_batch: int = 4,
    generator: torch.Generator | None = None,
    probe_maps: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-head statistics of every layer, each a tensor (L, H), from `model.attention_maps`.

    Entropy, sink mass and previous-token score come from `probe_ids` (B, T), or from `probe_maps` when the
    caller already has its maps; the induction score from a repeated random sequence of 2 * induction_period
    tokens. The caller puts the model in eval mode.
    """
    if 2 * induction_period > model.config.block_size:
        raise ValueError(
            f"induction_period {induction_period} needs 2 * {induction_period} tokens, more than the model's "
            f"block_size {model.config.block_size}; use a period of at most {model.config.block_size // 2}"
        )
    with torch.no_grad():
        maps = model.attention_maps(probe_ids) if probe_maps is None else probe_maps  # (L, B, H, T, T)
        repeated = repeated_random_tokens(
            model.config.vocab_size, induction_period, induction_batch, generator
        )
        induction_maps = model.attention_maps(repeated.to(probe_ids.device))  # (L, B, H, 2P, 2P)
    return {
        "entropy": attention_entropy(maps),
        "sink_mass": sink_mass(maps),
        "previous_token": previous_token_score(maps),
        "induction": induction_score(induction_maps, induction_period),
    }


def _mean_over_rows_and_batch(per_row: torch.Tensor) -> torch.Tensor:
    """(..., B, H, rows) -> (..., H): average the rows of each head, then the batch."""
    return per_row.mean(dim=-1).mean(dim=-2)


def _check_probs(probs: torch.Tensor, min_len: int) -> None:
    if probs.dim() not in (4, 5) or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(
            f"expected attention probabilities (B, H, T, T) or (L, B, H, T, T), got {tuple(probs.shape)}"
        )
    if probs.shape[-1] < min_len:
        raise ValueError(f"this statistic needs at least {min_len} tokens, got T = {probs.shape[-1]}")
