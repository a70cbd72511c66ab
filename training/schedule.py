"""Learning-rate schedules as plain functions of the optimizer step, and AdamW parameter groups."""

from __future__ import annotations

import math
from typing import Literal

import torch

Schedule = Literal["cosine", "wsd", "constant"]


def lr_multiplier(
    step: int,
    max_steps: int,
    warmup_steps: int,
    schedule: Schedule,
    min_lr_ratio: float,
    decay_fraction: float,
) -> float:
    """Factor of the peak learning rate at optimizer step `step` (0-based): linear warmup, then `cosine` decay,
    `wsd` (the peak, then a linear decay over the last `decay_fraction` of the steps) or `constant`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or max_steps <= warmup_steps:
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_start = max(warmup_steps, int(max_steps * (1 - decay_fraction)))
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1, max_steps - decay_start))
    return 1.0 - (1 - min_lr_ratio) * progress


def adamw_param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay only matrices (linear weights, the embedding); norms' gains keep their scale."""
    params = [p for p in module.parameters() if p.requires_grad]  # parameters() yields a tied weight once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def schedule_change_note(
    step: int, old_max_steps: int, new_max_steps: int, peak_lr: float, warmup_steps: int, schedule: Schedule,
    min_lr_ratio: float, decay_fraction: float,
) -> str | None:  # fmt: skip
    """A warning when a resume moves trainer.max_steps under a schedule that depends on it: the schedule is laid
    over the new length (as in nanoGPT and litgpt), so the learning rate jumps."""
    if old_max_steps == new_max_steps or schedule == "constant":
        return None
    shape = (warmup_steps, schedule, min_lr_ratio, decay_fraction)
    before = peak_lr * lr_multiplier(step, old_max_steps, *shape)
    after = peak_lr * lr_multiplier(step, new_max_steps, *shape)
    return (
        f"warning: trainer.max_steps {old_max_steps} -> {new_max_steps} on resume: the {schedule} schedule is laid "
        f"over {new_max_steps} steps, so the learning rate at step {step} goes from {before:.3g} to {after:.3g}"
    )
