"""Per-head scalars that summarise attention maps, so heads can be searched and compared over training, and the
step at which a head becomes an induction head. Each statistic takes causal softmax probabilities (B, H, T, T) or
(L, B, H, T, T) and averages over the batch and query rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

STATISTICS = ("entropy", "sink_mass", "previous_token", "induction")  # what head_statistics returns, in order


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean row entropy in nats: 0 when every row puts all its weight on one key."""
    return _per_head(probs, 1, lambda p: -torch.special.xlogy(p, p).sum(dim=-1))


def sink_mass(probs: torch.Tensor) -> torch.Tensor:
    """Mean weight on key 0 (the attention sink) over query rows t >= 1: causality forces row 0 onto key 0."""
    return _per_head(probs, 2, lambda p: p[..., 1:, 0])


def previous_token_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean weight on key t - 1 over query rows t >= 1 (row 0 has no previous token)."""
    return _per_head(probs, 2, lambda p: p.diagonal(offset=-1, dim1=-2, dim2=-1))


def induction_score(probs: torch.Tensor, period: int) -> torch.Tensor:
    """On a sequence repeating with `period`, the mean weight of query t >= period on key t - period + 1, the
    follower of its token's earlier copy: where an induction head looks."""
    if period < 1:
        raise ValueError(f"induction period must be at least 1, got {period}")
    # Offset 1 - period holds p[t, t - period + 1] for rows t >= period - 1; the first is still in the first copy.
    return _per_head(probs, period + 1, lambda p: p.diagonal(offset=1 - period, dim1=-2, dim2=-1)[..., 1:])


def repeated_random_tokens(
    vocab_size: int, period: int, batch: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Token ids (batch, 2 * period): a random segment twice, whose second copy only induction predicts."""
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
    """Each statistic (L, H) of a model in eval mode, on `probe_ids` (B, T) or their `probe_maps`."""
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


def _per_head(
    probs: torch.Tensor, min_len: int, rows: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """`rows` of the float32 probabilities, (..., B, H, rows), averaged over rows, then the batch."""
    if probs.dim() not in (4, 5) or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(
            f"expected attention probabilities (B, H, T, T) or (L, B, H, T, T), got {tuple(probs.shape)}"
        )
    if probs.shape[-1] < min_len:
        raise ValueError(f"this statistic needs at least {min_len} tokens, got T = {probs.shape[-1]}")
    return rows(probs.float()).mean(dim=-1).mean(dim=-2)


@dataclass(frozen=True)
class Formation:
    """Head `layer`/`head` first scored `score` > threshold at `step`."""

    layer: int
    head: int
    step: int
    score: float

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}"

    def message(self) -> str:
        return f"induction head {self.name} formed at step {self.step} (score {self.score:.2f})"


class PhaseChangeDetector:
    """Feed it the (L, H) induction scores of each measured step; it returns the heads that just rose strictly
    above `threshold` (once per head: a score that dips and recovers is no second phase change)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.formed: dict[tuple[int, int], Formation] = {}

    def update(self, step: int, scores: torch.Tensor) -> list[Formation]:
        """Record `scores` (L, H) measured at `step`; the formations first seen now, strongest first."""
        new = []
        for layer, head in (scores > self.threshold).nonzero().tolist():
            if (layer, head) not in self.formed:
                formation = Formation(layer, head, step, float(scores[layer, head]))
                self.formed[layer, head] = formation
                new.append(formation)
        return sorted(new, key=lambda f: -f.score)

    @property
    def formations(self) -> list[Formation]:
        """Every formation so far, in the order of their steps (ties: strongest first)."""
        return sorted(self.formed.values(), key=lambda f: (f.step, -f.score))
