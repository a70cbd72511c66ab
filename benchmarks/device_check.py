"""Everything a GPU should confirm, in one run of a few minutes: prints a table, exits 1 if a check fails.

    python -m benchmarks.device_check               # one CUDA GPU: the 124 M config of gpt2-small.yaml
    python -m benchmarks.device_check --cpu_smoke   # the same code paths, tiny, on CPU (the tests run it)

Checks, in order:
1. sdpa: the model's attention call (`model.attention.sdpa_attention`, GQA, causal) forward and backward at
   the training shape in bf16, under `sdpa_kernel` restricted to one fused backend at a time (flash, cuDNN),
   so a silent fallback to the math kernel is an error; outputs compared with the float32 explicit path.
   FAIL when no fused backend runs.
2. train: the config's model trained through Lightning (LitGPT + TextDataModule on the shipped Shakespeare,
   bf16-mixed, torch.compile, the config's batch and accumulation; warmup shortened to 10 steps so the loss
   moves): tokens/s and MFU after the compile steps, peak memory against training/memory.py's estimate, the
   attention ops the profiler saw in one compiled step (FAIL if any is not flash/cuDNN), the loss falling.
3. decode: `model.generate` with the KV cache on the trained weights in bf16, greedy (and `compile=True` when
   generate offers it): tokens/s at batch 1.
4. resume: a smaller model trained straight for 6 steps, and again stopped at step 3 and resumed from the
   checkpoint: losses and final weights must be equal (deterministic algorithms on).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

# cuBLAS reads this when it starts: without it, deterministic matmuls are refused (resume check).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.nn.attention import SDPBackend, sdpa_kernel

from data.datamodule import TINY_SHAKESPEARE, TextDataModule
from generation.timing import alternate_medians, wall_seconds
from model import GPT, generate
from model.attention import explicit_attention, sdpa_attention
from training import LitGPT
from training.flops import device_peak_flops, mfu, training_flops_per_token
from training.memory import estimate_training_memory

ROOT = Path(__file__).resolve().parents[1]
FUSED_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
SDPA_CASE = "forward + backward, GQA, causal"


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
    compile: bool
    decode_tokens: int
    resume_model: dict


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # PASS, FAIL or INFO
    value: str
    detail: str = ""


def passed(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def gpu_settings() -> Settings:
    """The 124 M model and batch of configs/gpt2-small.yaml."""
    config = yaml.safe_load((ROOT / "configs" / "gpt2-small.yaml").read_text())
    model = {**config["model"], "warmup_steps": 10}
    assert (model["n_layer"], model["n_embd"], model["n_head"], model["n_kv_head"]) == (12, 768, 12, 4)
    data = config["data"]
    return Settings(
        "cuda",
        model,
        data["vocab_size"],
        data["block_size"],
        data["batch_size"],
        config["trainer"]["accumulate_grad_batches"],
        steps=60,
        timed_from=20,
        compile=True,
        decode_tokens=256,
        resume_model={"n_layer": 4, "n_head": 8, "n_kv_head": 2, "n_embd": 256},
    )


def cpu_smoke_settings() -> Settings:
    """The same checks, small enough for the CPU tests (no compile: tests/training/test_configs.py has it)."""
    model = {
        "n_layer": 2,
        "n_head": 4,
        "n_kv_head": 2,
        "n_embd": 64,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "compile": False,
    }
    return Settings(
        "cpu",
        model,
        vocab_size=384,
        block_size=64,
        batch_size=4,
        accumulate=2,
        steps=12,
        timed_from=4,
        compile=False,
        decode_tokens=16,
        resume_model={"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32},
    )


def check_sdpa(device: str, shape: tuple[int, int, int, int, int], attention=sdpa_attention) -> list[Row]:
    """Forward and backward of `attention` at (B, H, Hkv, T, D) in bf16 under each fused backend alone."""
    b, h, hkv, t, d = shape
    generator = torch.Generator(device).manual_seed(0)
    q, k, v = (
        torch.randn(b, heads, t, d, device=device, generator=generator, dtype=torch.bfloat16)
        for heads in (h, hkv, hkv)
    )
    reference, _ = explicit_attention(q.float(), k.float(), v.float())
    rows = []
    for name, backend in FUSED_BACKENDS.items():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        try:
            with sdpa_kernel([backend]):
                out = attention(*leaves)
                out.float().square().sum().backward()
        except RuntimeError as error:  # "No available kernel": this backend cannot run the shape
            rows.append(Row(f"sdpa {name}", "INFO", "unavailable", str(error).splitlines()[0][:90]))
            continue
        diff = (out.float() - reference).abs().max().item()
        ok = diff < 0.05 and all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
        rows.append(Row(f"sdpa {name}", passed(ok), f"max |diff| {diff:.4f}", f"shape {shape} bf16"))
    fused = ", ".join(row.check[5:] for row in rows if row.status == "PASS")
    return [*rows, Row("sdpa fused for training", passed(bool(fused)), fused or "none", SDPA_CASE)]


def fused_attention_ops(op_names: set[str]) -> tuple[bool, list[str]]:
    """(all attention kernels fused, their names) from profiler op names; the public dispatcher entry
    `aten::scaled_dot_product_attention` is not a kernel and is ignored."""
    kernels = sorted(
        n for n in op_names if "scaled_dot_product" in n and n != "aten::scaled_dot_product_attention"
    )
    fused = bool(kernels) and all("flash" in n or "cudnn" in n for n in kernels)
    return fused, kernels


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


def trainer_for(settings: Settings, root: Path, max_steps: int, callbacks: list) -> L.Trainer:
    return L.Trainer(
        accelerator=settings.device,
        devices=1,
        precision="bf16-mixed",
        max_steps=max_steps,
        max_epochs=-1,
        accumulate_grad_batches=settings.accumulate,
        gradient_clip_val=1.0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )


def datamodule(settings: Settings, cache: Path, block_size: int | None = None) -> TextDataModule:
    return TextDataModule(
        data_files=str(TINY_SHAKESPEARE),
        cache_dir=str(cache),
        vocab_size=settings.vocab_size,
        block_size=block_size or settings.block_size,
        batch_size=settings.batch_size,
    )


def check_training(settings: Settings, work: Path) -> tuple[list[Row], LitGPT]:
    """Train the config's model for settings.steps steps; tokens/s, MFU, memory, attention ops, loss."""
    torch.manual_seed(0)
    module = LitGPT(
        vocab_size=settings.vocab_size,
        block_size=settings.block_size,
        **{**settings.model, "compile": settings.compile},
    )
    log = StepLog(settings.accumulate, profile_step=settings.timed_from)
    on_gpu = settings.device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer_for(settings, work / "train", settings.steps, [log]).fit(
        module, datamodule(settings, work / "cache")
    )
    config = module.model.config
    timed_steps = len(log.times) - 1 - settings.timed_from
    tokens = timed_steps * settings.batch_size * settings.block_size * settings.accumulate
    tokens_per_s = tokens / (log.times[-1] - log.times[settings.timed_from])
    peak = device_peak_flops(torch.device(settings.device))
    flops = training_flops_per_token(config, settings.block_size)
    estimate = estimate_training_memory(config, settings.batch_size, settings.block_size, "bf16-mixed")
    fused, kernels = fused_attention_ops(log.op_names)
    first, last = log.losses[0], sum(log.losses[-3:]) / 3
    falls = last < 0.95 * first and all(map(math.isfinite, log.losses))
    label = f"{config.n_layer}L {config.n_embd}w {config.n_head}/{config.n_kv_head}h T{settings.block_size}"
    run = f"{label}, batch {settings.batch_size} x {settings.accumulate} accumulated, bf16-mixed, "
    run += f"compile={settings.compile}, steps {settings.timed_from}+"
    utilisation = f"{mfu(tokens_per_s, flops, peak):.1%}" if peak else "n/a"
    work = (
        f"{flops / 1e6:.0f} MFLOP/token; peak {peak / 1e12:.0f} TFLOP/s"
        if peak
        else "device not in the table"
    )
    memory = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if on_gpu else "n/a"
    expected = f"estimate {estimate.total_bytes / 2**30:.2f} GiB (eager)"
    seen = ", ".join(k.split("::")[-1] for k in kernels) or "none seen"
    rows = [
        Row("train tokens/s", "INFO", f"{tokens_per_s:,.0f}", run),
        Row("train MFU", "INFO", utilisation, work),
        Row("train peak memory", "INFO", memory, expected),
        Row("train attention kernels", passed(fused), seen, f"profiled step {settings.timed_from}"),
        Row("train loss falls", passed(falls), f"{first:.3f} -> {last:.3f}", f"{len(log.losses)} steps"),
    ]
    return rows, module


def check_decode(settings: Settings, trained: GPT, prompt: torch.Tensor) -> list[Row]:
    """tokens/s of cached greedy decoding at batch 1 in bf16 (median of 3 after a warm-up)."""
    model = GPT(trained.config)
    model.load_state_dict(trained.state_dict())
    model = model.to(settings.device, torch.bfloat16).eval()
    variants = {"decode tokens/s": {}, "decode tokens/s (compile=True)": {"compile": True}}

    def decode(extra: dict) -> None:
        with torch.inference_mode():
            generate(model, prompt, settings.decode_tokens, temperature=0.0, **extra)

    runs = {name: wall_seconds(lambda extra=extra: decode(extra)) for name, extra in variants.items()}
    seconds = alternate_medians(runs, 3)  # after a warm-up round, which compiles
    detail = f"prompt {prompt.shape[1]}, {settings.decode_tokens} new, batch 1, bf16, KV cache"
    return [Row(name, "INFO", f"{settings.decode_tokens / s:,.0f}", detail) for name, s in seconds.items()]


class StopAt(L.Callback):
    """Ends fit() after `step` optimizer steps, as an interruption would, keeping max_steps (the schedule)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def check_resume(settings: Settings, work: Path, steps: int = 6, stop: int = 3) -> list[Row]:
    """Straight run vs. stop at `stop` + resume from last.ckpt: equal losses and weights on this device."""
    small = replace(settings, accumulate=1, compile=False, block_size=min(settings.block_size, 256))

    def run(root: Path, stop_at: int | None = None, ckpt: Path | None = None) -> tuple[list[float], LitGPT]:
        torch.manual_seed(0)
        module = LitGPT(
            vocab_size=small.vocab_size,
            block_size=small.block_size,
            **{**settings.model, **settings.resume_model, "compile": False},
        )
        log = StepLog(1)
        callbacks = [log, ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=1, save_top_k=0)]
        callbacks += [StopAt(stop_at)] if stop_at else []
        trainer_for(small, root, steps, callbacks).fit(
            module, datamodule(small, work / "cache"), ckpt_path=ckpt
        )
        return log.losses, module

    torch.use_deterministic_algorithms(True, warn_only=True)  # same kernels, same reduction order, every run
    try:
        straight_losses, straight = run(work / "straight")
        first, _ = run(work / "resumed", stop_at=stop)
        rest, resumed = run(work / "resumed", ckpt=work / "resumed" / "last.ckpt")
    finally:
        torch.use_deterministic_algorithms(False)
    diffs = [
        (a - b).abs().max().item()
        for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True)
    ]
    same_losses = straight_losses == first + rest
    same = same_losses and max(diffs) == 0
    runs = f"{steps} steps straight vs stop at {stop} + resume; losses equal: {same_losses}"
    return [Row("resume exact", passed(same), f"max |weight diff| {max(diffs):.2e}", runs)]


def print_table(rows: list[Row]) -> None:
    columns = ("check", "status", "value")
    widths = [max(len(getattr(r, column)) for r in rows) for column in columns]
    for row in rows:
        cells = [getattr(row, column).ljust(width) for column, width in zip(columns, widths, strict=True)]
        print("  ".join([*cells, row.detail]).rstrip())


def run_checks(settings: Settings, work: Path) -> list[Row]:
    """Every check in order; a check that raises becomes a FAIL row and the run goes on where it can."""
    device = torch.device(settings.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke mode)"
    rows = [Row("device", "INFO", name, f"torch {torch.__version__}")]
    model = settings.model
    heads = (model["n_head"], model["n_kv_head"])
    shape = (settings.batch_size, *heads, settings.block_size, model["n_embd"] // model["n_head"])
    rows += _guarded("sdpa", lambda: check_sdpa(settings.device, shape))
    outcome = _guarded("train", lambda: check_training(settings, work))  # (rows, module), or a FAIL row
    train_rows, trained = outcome if isinstance(outcome, tuple) else (outcome, None)
    rows += train_rows
    if trained is not None:
        prompt = torch.as_tensor(trained.trainer.datamodule.val_tokens[:64].astype("int64"))[None].to(device)
        rows += _guarded("decode", lambda: check_decode(settings, trained.model, prompt))
    rows += _guarded("resume", lambda: check_resume(settings, work))
    return rows


def _guarded(section: str, check):
    start = time.perf_counter()
    try:
        result = check()
    except Exception as error:  # a crash is a failed check: report it, keep the other checks' results
        import traceback

        traceback.print_exc()
        return [
            Row(section, "FAIL", type(error).__name__, str(error).splitlines()[0][:100] if str(error) else "")
        ]
    print(f"[{section}: {time.perf_counter() - start:.0f} s]", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--cpu_smoke", action="store_true", help="tiny model on CPU: the code paths, not the speed")
    add("--steps", type=int, default=None, help="training steps (default 60 on GPU, 12 smoke)")
    add("--min_mfu", type=float, default=0.0, help="FAIL when MFU is below this (e.g. 0.45)")
    args = parser.parse_args(argv)
    settings = cpu_smoke_settings() if args.cpu_smoke else gpu_settings()
    if args.steps:
        settings = replace(settings, steps=args.steps, timed_from=min(settings.timed_from, args.steps // 3))
    if settings.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run with --cpu_smoke to check the code paths on CPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        rows = run_checks(settings, Path(tmp))
    rows = [_apply_min_mfu(row, args.min_mfu) for row in rows]
    print_table(rows)
    return exit_code(rows)


def exit_code(rows: list[Row]) -> int:
    """1 when any check failed (printing which), else 0."""
    failed = [row.check for row in rows if row.status == "FAIL"]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return 1 if failed else 0


def _apply_min_mfu(row: Row, min_mfu: float) -> Row:
    if row.check != "train MFU" or not min_mfu or row.value == "n/a":
        return row
    value = float(row.value.rstrip("%")) / 100
    return replace(row, status=passed(value >= min_mfu), detail=f"{row.detail}; target {min_mfu:.0%}")


if __name__ == "__main__":
    sys.exit(main())
