"""The device check's Lightning runs (benchmarks/device_check.py): training speed, memory, attention kernels and
loss, and an exact resume."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

# cuBLAS reads this when it starts: without it, deterministic matmuls are refused (resume check).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data.datamodule import TextDataModule
from training import LitGPT
from training.flops import device_peak_flops, mfu, training_flops_per_token
from training.memory import estimate_training_memory

# The Trainer flags of every benchmark's run: no logger, progress bar, summary or validation; clipping as train.py.
QUIET_TRAINER = dict(devices=1, max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1.0)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    device: str
    model: dict  # LitGPT arguments
    vocab_size: int
    block_size: int
    batch_size: int
    accumulate: int
    steps: int
    timed_from: int  # steps before this one include compilation: not timed
    decode_tokens: int
    resume_model: dict
    min_mfu: float = 0.0  # the MFU row FAILs below it (0: INFO only)

    def sizes(self) -> dict[str, int]:
        return {"vocab_size": self.vocab_size, "block_size": self.block_size}


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # PASS, FAIL or INFO
    value: str
    detail: str = ""


def passed(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def fused_attention_ops(op_names: set[str]) -> tuple[bool, list[str]]:
    """(all attention kernels fused, their names) from profiler op names."""
    entry = "aten::scaled_dot_product_attention"  # the dispatcher's entry, not a kernel
    kernels = sorted(n for n in op_names if "scaled_dot_product" in n and n != entry)
    return bool(kernels) and all("flash" in n or "cudnn" in n for n in kernels), kernels


class StepLog(L.Callback):
    """Time and loss at the end of every optimizer step; profiles the ops of one step (`profile_step`)."""

    def __init__(self, accumulate: int, profile_step: int | None = None) -> None:
        self.accumulate, self.profile_step = accumulate, profile_step
        self.times: list[float] = []
        self.losses: list[float] = []
        self.op_names: set[str] = set()
        self._profiler = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.profile_step and self._profiler is None and not self.op_names:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self._profiler.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.accumulate:
            return
        # Lightning divides the loss by the accumulation count; .item() waits for the GPU: honest times.
        self.losses.append(float(outputs["loss"]) * self.accumulate)
        self.times.append(time.perf_counter())
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self.op_names = {event.key for event in self._profiler.key_averages()}
            self._profiler = None


def fit(settings: Settings, module: LitGPT, root: Path, cache: Path, callbacks: list, **fit_kwargs) -> None:
    """Trainer.fit of `module` on the shipped Shakespeare in bf16-mixed, as train.py would run it."""
    trainer = L.Trainer(
        accelerator=settings.device, precision="bf16-mixed", max_steps=settings.steps, default_root_dir=root,
        accumulate_grad_batches=settings.accumulate, callbacks=callbacks, **QUIET_TRAINER,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )  # fmt: skip
    data = TextDataModule(cache_dir=str(cache), batch_size=settings.batch_size, **settings.sizes())
    trainer.fit(module, data, **fit_kwargs)


def check_training(settings: Settings, work: Path) -> tuple[list[Row], LitGPT]:
    """Train the config's model for settings.steps steps; tokens/s, MFU, memory, attention ops, loss."""
    torch.manual_seed(0)
    module = LitGPT(**settings.sizes(), **settings.model)
    log = StepLog(settings.accumulate, profile_step=settings.timed_from)
    on_gpu = settings.device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    fit(settings, module, work / "train", work / "cache", [log])
    config, timed_from = module.model.config, settings.timed_from
    tokens_per_step = settings.batch_size * settings.block_size * settings.accumulate
    timed_steps = len(log.times) - 1 - timed_from
    tokens_per_s = timed_steps * tokens_per_step / (log.times[-1] - log.times[timed_from])
    peak = device_peak_flops(torch.device(settings.device))
    flops = training_flops_per_token(config, settings.block_size)
    estimate = estimate_training_memory(config, settings.batch_size, settings.block_size, "bf16-mixed")
    fused, kernels = fused_attention_ops(log.op_names)
    first, last = log.losses[0], sum(log.losses[-3:]) / 3
    falls = last < 0.95 * first and all(map(math.isfinite, log.losses))
    run = (f"{config.n_layer}L {config.n_embd}w {config.n_head}/{config.n_kv_head}h T{settings.block_size}, batch "
           f"{settings.batch_size} x {settings.accumulate} accumulated, bf16-mixed, "
           f"compile={settings.model['compile']}, steps {timed_from}+")  # fmt: skip
    mfu_row = Row("train MFU", "INFO", "n/a", "device not in the table")
    if peak:
        utilisation = mfu(tokens_per_s, flops, peak)
        basis = f"{flops / 1e6:.0f} MFLOP/token; peak {peak / 1e12:.0f} TFLOP/s"
        status = passed(utilisation >= settings.min_mfu) if settings.min_mfu else "INFO"
        target = f"; target {settings.min_mfu:.0%}" if settings.min_mfu else ""
        mfu_row = Row("train MFU", status, f"{utilisation:.1%}", basis + target)
    memory = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if on_gpu else "n/a"
    seen = ", ".join(k.split("::")[-1] for k in kernels) or "none seen"
    return [
        Row("train tokens/s", "INFO", f"{tokens_per_s:,.0f}", run),
        mfu_row,
        Row("train peak memory", "INFO", memory, f"estimate {estimate.total_bytes / 2**30:.2f} GiB (eager)"),
        Row("train attention kernels", passed(fused), seen, f"profiled step {timed_from}"),
        Row("train loss falls", passed(falls), f"{first:.3f} -> {last:.3f}", f"{len(log.losses)} steps"),
    ], module


class StopAt(L.Callback):
    """Ends fit() after `step` optimizer steps, as an interruption would, keeping max_steps (the schedule)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def check_resume(settings: Settings, work: Path, steps: int = 6, stop: int = 3) -> list[Row]:
    """Straight run vs. stop at `stop` + resume from last.ckpt: equal losses and weights on this device."""
    small = replace(settings, accumulate=1, block_size=min(settings.block_size, 256), steps=steps)

    def run(root: Path, stop_at: int | None = None, ckpt: Path | None = None) -> tuple[list[float], LitGPT]:
        torch.manual_seed(0)
        model = {**settings.model, **settings.resume_model, "compile": False}
        module = LitGPT(**small.sizes(), **model)
        log = StepLog(1)
        callbacks = [log, ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=1, save_top_k=0)]
        callbacks += [StopAt(stop_at)] if stop_at else []
        fit(small, module, root, work / "cache", callbacks, ckpt_path=ckpt)
        return log.losses, module

    torch.use_deterministic_algorithms(True, warn_only=True)  # same kernels, same reduction order, every run
    try:
        straight_losses, straight = run(work / "straight")
        first, _ = run(work / "resumed", stop_at=stop)
        rest, resumed = run(work / "resumed", ckpt=work / "resumed" / "last.ckpt")
    finally:
        torch.use_deterministic_algorithms(False)
    pairs = zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True)
    diff = max((a - b).abs().max().item() for a, b in pairs)
    same_losses = straight_losses == first + rest
    runs = f"{steps} steps straight vs stop at {stop} + resume; losses equal: {same_losses}"
    return [Row("resume exact", passed(same_losses and diff == 0), f"max |weight diff| {diff:.2e}", runs)]
