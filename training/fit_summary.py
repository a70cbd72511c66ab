"""What a fit prints: the run's cost before the first step, so a config that cannot fit says so early (FitReport);
after the last, the final loss, the validation-text score and how to sample (FitSummary). The score is per
character and byte, so runs compare across tokenizers, which `val/loss` (nats per token) cannot.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from common.errors import UserError
from data.batches import IGNORE_INDEX
from model import ModelConfig

from .callback_rules import evaluating, loggers_of, runs_on_this_rank
from .flops import device_peak_flops, training_flops_per_token
from .memory import estimate_training_memory
from .samples import SampleGenerations
from .wandb_history import log_what_was_lost
from .wandb_logger import RunWandbLogger

# The whole validation text of the from-scratch configs; fine-tunes bound it (a CPU scores 130 tokens/s of 135 M).
MAX_SCORED_TOKENS = 131_072
DEFAULT_PROMPT = "Once upon a time"
SCORE_KEY = "val/text_bpb"  # in the wandb summary: a run resumed after its end scores only when none holds it
# float32 logits held at once: 64 windows of gpt2-small would be 13 GB, twice that with the softmax.
LOGITS_BUDGET_BYTES = 256 * 2**20


def windows_per_batch(block_size: int, vocab_size: int) -> int:
    """How many windows of logits fit LOGITS_BUDGET_BYTES (at least one)."""
    return max(1, LOGITS_BUDGET_BYTES // (block_size * vocab_size * 4))


@torch.no_grad()
def score_validation(
    model,
    tokenizer,
    tokens,
    block_size: int,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    mask=None,
) -> dict[str, float]:
    """Nats per token, character and byte over every token of `tokens` but the first, in non-overlapping windows
    of `block_size`; with `mask` (chat: 1 on the assistant's tokens) only the masked tokens count."""
    device = next(model.parameters()).device
    batch_size = batch_size or windows_per_batch(block_size, model.config.vocab_size)
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    keep = torch.ones(len(ids), dtype=torch.bool) if mask is None else torch.from_numpy(np.asarray(mask) != 0)
    targets = ids.masked_fill(~keep, IGNORE_INDEX)
    full = (len(ids) - 1) // block_size
    x = ids[: full * block_size].view(full, block_size)
    y = targets[1 : full * block_size + 1].view(full, block_size)
    nats = 0.0
    for start in range(0, full, batch_size):
        logits = model(x[start : start + batch_size].to(device)).flatten(0, 1).float()
        target = y[start : start + batch_size].flatten().to(device)
        nats += F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum").item()
        if progress is not None:
            progress(min(start + batch_size, full), full)
    tail = ids[full * block_size :].to(device)
    if len(tail) > 1:
        tail_targets = targets[full * block_size + 1 :].to(device)
        nats += F.cross_entropy(
            model(tail[None, :-1])[0].float(), tail_targets, ignore_index=IGNORE_INDEX, reduction="sum"
        ).item()
    count = int(keep[1:].sum())
    text = tokenizer.decode(ids[1:][keep[1:]].tolist())
    return {
        "nats_per_token": nats / max(1, count),
        "nats_per_char": nats / max(1, len(text)),
        "bpb": nats / math.log(2) / max(1, len(text.encode("utf-8"))),
        "chars": len(text),
        "tokens": count,
    }


def _size(n: float) -> str:
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
    trainable: int | None = None,
    weight_bytes: int | None = None,
) -> list[str]:
    est = estimate_training_memory(config, batch_size, seq_len, precision, shards, trainable, weight_bytes)
    sharded = f", sharded {shards} ways" if shards > 1 else ""
    learned = "" if trainable is None else f"; trained: {trainable:,} in the adapters, the rest frozen"
    lines = [
        f"parameters: {est.parameters:,} ({est.parameters / 1e6:.1f} M){learned}",
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
    """Prints `fit_report` on rank 0 when fit starts."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        batch_size = getattr(trainer.datamodule, "batch_size", None)
        if batch_size is None:
            return
        config, device = pl_module.model.config, pl_module.device
        seq_len = getattr(trainer.datamodule, "block_size", config.block_size)
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        sharded = isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy))
        shards = trainer.world_size if sharded else 1
        tensors = [*pl_module.model.parameters(), *pl_module.model.buffers()]
        frozen = any(not p.requires_grad for p in pl_module.model.parameters())
        trainable = (
            sum(p.numel() for p in pl_module.model.parameters() if p.requires_grad) if frozen else None
        )
        weight_bytes = sum(t.numel() * t.element_size() for t in tensors) if frozen else None
        lines = fit_report(
            config, batch_size, seq_len, str(trainer.precision), shards, memory, device_peak_flops(device),
            trainable, weight_bytes,
        )  # fmt: skip
        rank_zero_info("Run size (estimate):\n  " + "\n  ".join(lines))


class FitSummary(L.Callback):
    """Prints the summary on rank 0 when fit ends normally, and puts the scores in the wandb summary; `max_tokens`
    (train.py's `score_tokens`) bounds the validation-text score, 0 skips it. A run resumed at its last step (killed
    after its final checkpoint) trains nothing: it logs what the killed run had not, then ends the same way."""

    def __init__(self, max_tokens: int = MAX_SCORED_TOKENS) -> None:
        if max_tokens < 0:
            raise UserError(f"score_tokens: must be at least 0 (0 skips the final score), got {max_tokens}")
        self.max_tokens = max_tokens
        self._resumed_step: int | None = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._resumed_step = checkpoint["global_step"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step, max_steps = self._resumed_step, trainer.max_steps
        if step is None or not 0 <= max_steps <= step:
            return
        # Lightning sets the data up, trains nothing and skips on_train_end: the end is ours to run.
        loop = trainer.fit_loop

        def run_then_end() -> None:
            del loop.run
            loop.run()
            self._end_finished_run(trainer, pl_module, step)

        loop.run = run_then_end

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._summarise(trainer, pl_module, self.max_tokens)

    def _end_finished_run(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        logged = log_what_was_lost(trainer, step)
        # Scored again only for a wandb summary that lacks it: the score itself was printed when the run ended.
        loggers = loggers_of(trainer, RunWandbLogger)
        lacking = any(not logger.holds_summary(SCORE_KEY) for logger in loggers)
        scored = self._summarise(trainer, pl_module, self.max_tokens if lacking else 0)
        if not (logged or scored):  # the new wandb segment would hold nothing
            for logger in loggers:
                logger.discard_segment()

    def _summarise(self, trainer: L.Trainer, pl_module: L.LightningModule, max_tokens: int) -> bool:
        """Print the summary (rank 0); whether a score went into the wandb summary."""
        if not runs_on_this_rank(trainer, pl_module.model):
            return False
        # Every rank of a sharded model joins the forward passes.
        scores = _score(trainer, pl_module, max_tokens)
        if not trainer.is_global_zero:
            return False
        lines = [f"finished step {trainer.global_step}/{trainer.max_steps}"]
        val_loss = trainer.callback_metrics.get("val/loss")
        if val_loss is not None:
            lines[0] += f" | val/loss {float(val_loss):.4f} (nats/token, {trainer.limit_val_batches} batches)"
        if scores is not None:
            lines.append(
                f"validation text ({scores['covered']}: {scores['chars']:,} characters, {scores['tokens']:,} "
                f"tokens): {scores['nats_per_char']:.4f} nats/char, {scores['bpb']:.4f} bits/byte"
            )
            for logger in loggers_of(trainer, WandbLogger):
                logger.experiment.summary.update(
                    {"val/nats_per_char": scores["nats_per_char"], SCORE_KEY: scores["bpb"]}
                )
        run = shlex.quote(str(Path(trainer.default_root_dir)))
        if getattr(trainer.datamodule, "val_mask", None) is not None:  # fine-tuned on conversations
            lines.append(f"chat with it: python generate.py --checkpoint {run} --chat")
        else:  # the first non-blank prompt of the samples table (the run's own example), else a generic one
            samples = [c for c in trainer.callbacks if isinstance(c, SampleGenerations)]
            prompts = [prompt for callback in samples for prompt in callback.prompts if prompt.strip()]
            prompt = shlex.quote(prompts[0] if prompts else DEFAULT_PROMPT)
            lines.append(f"sample from it: python generate.py --checkpoint {run} --prompt {prompt}")
        print("\n".join(lines), flush=True)
        return scores is not None


def _score(trainer: L.Trainer, pl_module: L.LightningModule, max_tokens: int) -> dict | None:
    if trainer.limit_val_batches == 0 or max_tokens == 0:  # validation off: scoring its text is unasked for
        return None
    datamodule = trainer.datamodule
    tokens = getattr(datamodule, "val_tokens", None)
    tokenizer = getattr(datamodule, "tokenizer", None)
    if tokens is None or tokenizer is None or len(tokens) < 2:
        return None
    scored = min(len(tokens), max_tokens)
    if trainer.is_global_zero:
        print(f"scoring the validation text: {scored:,} tokens (score_tokens bounds it)", file=sys.stderr)
    mask = getattr(datamodule, "val_mask", None)  # chat: the assistant's tokens only
    with evaluating(pl_module):
        scores = score_validation(
            pl_module.model, tokenizer, tokens[:scored], datamodule.block_size,
            progress=_tenths() if trainer.is_global_zero else None,
            mask=None if mask is None else mask[:scored],
        )  # fmt: skip
    whole = scored == len(tokens)
    scores["covered"] = "all of it" if whole else f"its first {scored:,} of {len(tokens):,} tokens"
    return scores


def _tenths() -> Callable[[int, int], None]:
    """A score_validation progress: a stderr line at each tenth of the windows (when 10 or more)."""
    shown = 0

    def report(done: int, total: int) -> None:
        nonlocal shown
        tenth = done * 10 // total
        if total >= 10 and tenth > shown:
            shown = tenth
            print(f"  scored {done:,} of {total:,} windows", file=sys.stderr, flush=True)

    return report
