"""Tokens per second and model FLOPs utilisation, measured between optimizer steps."""

from __future__ import annotations

import time

import lightning as L
import torch

# Dense bf16 peak FLOP/s by device name fragment; MFU is only logged for devices listed here.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10G": 125e12, "4090": 165e12}


def flops_per_token(model: torch.nn.Module, block_size: int) -> float:
    """Training FLOPs per token: 6 per weight (forward + backward) plus the attention matmuls."""
    config = model.config
    attention = 12 * config.n_layer * config.n_embd * block_size
    weights = sum(p.numel() for p in model.parameters()) - (0 if config.tie_embeddings else model.wte.weight.numel())
    return 6 * weights + attention


class ThroughputMonitor(L.Callback):
    """Logs `train/tokens_per_s` (all ranks together) and, on known GPUs, `train/mfu`, averaged over the
    steps between two logging points (trainer.log_every_n_steps)."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._tokens = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._start is None:  # the first batch pays for warm-up and compilation: not measured
            self._start = now
            return
        self._tokens += batch[0].numel() * trainer.world_size
        if trainer.global_step % trainer.log_every_n_steps or not self._tokens:
            return
        tokens_per_s = self._tokens / (now - self._start)
        pl_module.log("train/tokens_per_s", tokens_per_s, prog_bar=True)
        peak = _peak_flops(pl_module.device)
        if peak:
            flops = flops_per_token(pl_module.model, batch[0].shape[1]) * tokens_per_s
            pl_module.log("train/mfu", flops / (peak * trainer.world_size))
        self._start, self._tokens = now, 0


def _peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
