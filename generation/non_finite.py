"""Which module of a model first outputs a NaN or an infinity: run once after a failure, never on the decode path
(generation/sampling.py's `naming_the_broken_layer` calls it)."""

from __future__ import annotations

import torch


@torch.no_grad()
def first_non_finite(model: torch.nn.Module, idx: torch.Tensor) -> str | None:
    """The name of the first module (embedding, block, final norm, head) whose output on idx (B, T) holds a NaN
    or an infinity, or None: a full forward with hooks, for after a failure."""
    names = {model.wte: "wte", **{block: f"blocks.{i}" for i, block in enumerate(model.blocks)}}
    names |= {model.norm: "norm", model.lm_head: "lm_head"}
    finite: dict[str, torch.Tensor] = {}  # filled in the order the forward runs the modules

    def record(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:  # None: the output stays
        finite[names[module]] = out.isfinite().all()

    hooks = [module.register_forward_hook(record) for module in names]
    try:
        model(idx[:, -model.config.block_size :])
    finally:
        for hook in hooks:
            hook.remove()
    return next((name for name, ok in finite.items() if not ok), None)
