"""Before the first step, print what the configured run costs, so a config that cannot fit says so early."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from model import ModelConfig

from .flops import device_peak_flops, training_flops_per_token
from .memory import MemoryEstimate, estimate_training_memory


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1 (GiB at most)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fit_report(
    config: ModelConfig,
    batch_size: int,
    seq_len: int,
    precision: str,
    shards: int = 1,
    device_bytes: int | None = None,
    peak_flops: float | None = None,
) -> list[str]:
    """The lines of the report: parameters, per-device memory by kind, KV cache per token, FLOPs per token."""
    est: MemoryEstimate = estimate_training_memory(config, batch_size, seq_len, precision, shards)
    sharded = f", sharded {shards} ways" if shards > 1 else ""
    lines = [
        f"parameters: {est.parameters:,} ({est.parameters / 1e6:.1f} M)",
        f"weights + grads: {_size(est.weight_bytes + est.grad_bytes)}{sharded} ({precision})",
        f"AdamW state: {_size(est.optimizer_bytes)}{sharded}",
        f"activations: {_size(est.activation_bytes)} for a micro-batch of {batch_size} x {seq_len} tokens "
        "(eager estimate; transient buffers come on top)",
        f"total per device: {_size(est.total_bytes)}",
        f"KV cache: {est.kv_cache_bytes_per_token:,} bytes per token "
        # The model's context, not the training length: a fine-tune trains 256 tokens of an 8192 context.
        f"({_size(est.kv_cache_bytes_per_token * config.block_size)} per {config.block_size:,}-token sequence)",
    ]
    flops = training_flops_per_token(config, seq_len)
    line = f"training FLOPs per token: {flops / 1e6:.1f} M (6N + attention)"
    if peak_flops:
        line += f"; at 100% MFU {peak_flops / flops:,.0f} tokens/s per device"
    lines.append(line)
    if device_bytes is not None:
        verdict = "fits" if est.total_bytes < device_bytes else "DOES NOT FIT: lower data.batch_size or shard"
        lines.append(f"device memory: {_size(device_bytes)}: {verdict}")
    return lines


class FitReport(L.Callback):
    """Prints `fit_report` on rank 0 when fit starts (weights sharded across ranks under FSDP)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        batch_size = getattr(datamodule, "batch_size", None)
        config = pl_module.model.config
        seq_len = getattr(datamodule, "block_size", config.block_size)
        if batch_size is None:
            return
        device = pl_module.device
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        shards = trainer.world_size if _shards_parameters(trainer.strategy) else 1
        precision, peak = str(trainer.precision), device_peak_flops(device)
        lines = fit_report(config, batch_size, seq_len, precision, shards, memory, peak)
        rank_zero_info("Run size (estimate):\n  " + "\n  ".join(lines))


def _shards_parameters(strategy) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    return isinstance(strategy, (FSDPStrategy, ModelParallelStrategy))
