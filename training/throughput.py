"""Tokens per second and model FLOPs utilisation, measured between optimizer steps."""

from __future__ import annotations

import time

import lightning as L

from .flops import device_peak_flops, mfu, training_flops_per_token


class ThroughputMonitor(L.Callback):
    """Logs `train/tokens_per_s` (all ranks together) and `train/mfu`, averaged over the steps between two
    logging points (trainer.log_every_n_steps).

    Args:
        peak_flops: Peak FLOP/s of one device for MFU; None looks the GPU up in
            `training.flops.PEAK_BF16_FLOPS` (no MFU on CPU or on GPUs missing from the table).
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        self.peak_flops = peak_flops
        self._start: float | None = None
        self._tokens = 0
        self._logged_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._start is None:  # the first batch pays for warm-up and compilation: not measured
            self._start = now
            return
        self._tokens += batch[0].numel() * trainer.world_size
        step = trainer.global_step
        # With gradient accumulation several batches end on one step: log once, at the last of them.
        if step % trainer.log_every_n_steps or step == self._logged_step or not self._tokens:
            return
        self._logged_step = step
        tokens_per_s = self._tokens / (now - self._start)
        pl_module.log("train/tokens_per_s", tokens_per_s, prog_bar=True)
        peak = self.peak_flops or device_peak_flops(pl_module.device)
        if peak:
            flops = training_flops_per_token(pl_module.model.config, batch[0].shape[1])
            pl_module.log("train/mfu", mfu(tokens_per_s, flops, peak, trainer.world_size))
        self._start, self._tokens = now, 0
