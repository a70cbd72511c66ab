"""Training FLOPs per token, the bf16 peak of known GPUs, and the callback that logs tokens/s and `train/mfu`.

The PaLM convention (appendix B; also nanoGPT's and torchtitan's, so MFU figures compare): 6 N + 12 L H D T, with
N the matmul weights (a tied embedding once, as the head; no norm gains) and the attention term over the full
context T, not the causal T / 2, overstating what the kernels do as the published convention does.
"""

from __future__ import annotations

import re
import time

import lightning as L
import torch

from model import ModelConfig

# Dense bf16 peak FLOP/s from NVIDIA's datasheets (sparsity figures halved; RTX 4090: Ada whitepaper, FP32
# accumulate). A key matches when all its words are words of the device name ("NVIDIA A100-SXM4-80GB", split at
# spaces and hyphens); the first match wins, so NVL/PCIe come before SXM, and "L4" does not match "L40S".
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("A10", 125e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("4090", 165e12),
)


def matmul_params(config: ModelConfig) -> int:
    """N of the 6N rule: the weights used in matmuls (blocks' linear layers + LM head)."""
    c, d = config.n_embd, config.head_dim
    attention = c * (config.n_head + 2 * config.n_kv_head) * d + config.n_head * d * c  # qkv + proj
    mlp = c * 2 * config.hidden_dim + config.hidden_dim * c  # gate_up + down
    return config.n_layer * (attention + mlp) + c * config.vocab_size


def training_flops_per_token(config: ModelConfig, seq_len: int) -> int:
    """Forward + backward FLOPs per token at context `seq_len`: 6 N + the attention term 12 * L * H * D * T."""
    return 6 * matmul_params(config) + 12 * config.n_layer * config.n_head * config.head_dim * seq_len


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU by its torch.cuda.get_device_name, None when not in the table."""
    words = set(re.split(r"[\s\-_]+", device_name.lower()))
    return next((flops for key, flops in PEAK_BF16_FLOPS if set(key.lower().split()) <= words), None)


def device_peak_flops(device: torch.device) -> float | None:
    """None on CPU and on GPUs missing from the table."""
    return peak_bf16_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float, world_size: int = 1) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all `world_size` devices."""
    return tokens_per_s * flops_per_token / (peak_flops * world_size)


class ThroughputMonitor(L.Callback):
    """Logs `train/tokens_per_s` (all ranks together) and `train/mfu` over each logging interval; `peak_flops`
    (one device's) defaults to the PEAK_BF16_FLOPS entry of the GPU."""

    def __init__(self, peak_flops: float | None = None) -> None:
        self.peak_flops = peak_flops
        self._start: float | None = None
        self._first_batch_start: float | None = None
        self._tokens = 0
        self._logged_step = -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None and self._first_batch_start is None:
            self._first_batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._start is None:
            # The first batch of a start pays for warm-up and compilation: measured only when it is itself a
            # logging step (a resume's first step often is), else the interval starts after it.
            self._start, first = self._first_batch_start or now, True
        else:
            first = False
        self._tokens += batch[0].numel() * trainer.world_size
        step = trainer.global_step
        # With gradient accumulation several batches end on one step: log once, at the last of them.
        if step % trainer.log_every_n_steps or step == self._logged_step or not self._tokens:
            if first:
                self._start, self._tokens = now, 0
            return
        self._logged_step = step
        tokens_per_s = self._tokens / (now - self._start)
        pl_module.log("train/tokens_per_s", tokens_per_s, prog_bar=True)
        peak = self.peak_flops or device_peak_flops(pl_module.device)
        if peak:
            flops = training_flops_per_token(pl_module.model.config, batch[0].shape[1])
            pl_module.log("train/mfu", mfu(tokens_per_s, flops, peak, trainer.world_size))
        self._start, self._tokens = now, 0
