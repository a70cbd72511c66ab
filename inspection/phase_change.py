"""Spot the step at which a head becomes an induction head: its score first rises above a threshold (once per
head: a score that dips and recovers is no second phase change)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    above `threshold`."""

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
