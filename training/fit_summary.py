"""The last lines of a finished fit: the final validation loss, the whole-text score, and how to sample."""

from __future__ import annotations

import shlex
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from .samples import SampleGenerations
from .sharding import runs_on_this_rank
from .val_score import score_validation

# Scoring is a forward pass over the validation text; above this many tokens only the first ones are scored.
MAX_SCORED_TOKENS = 1_000_000
DEFAULT_PROMPT = "Once upon a time"


class FitSummary(L.Callback):
    """On rank 0 when fit ends normally: print the summary lines and put the scores in the wandb summary."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not runs_on_this_rank(trainer, pl_module.model):
            return
        scores = _score(trainer, pl_module)  # every rank of a sharded model joins its forward passes
        if not trainer.is_global_zero:
            return
        lines = [f"finished step {trainer.global_step}/{trainer.max_steps}" + _val_loss(trainer)]
        if scores is not None:
            lines.append(
                f"validation text ({scores['covered']}: {scores['chars']:,} characters, {scores['tokens']:,} "
                f"tokens): {scores['nats_per_char']:.4f} nats/char, {scores['bpb']:.4f} bits/byte"
            )
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    logger.experiment.summary.update(
                        {"val/nats_per_char": scores["nats_per_char"], "val/text_bpb": scores["bpb"]}
                    )
        run = shlex.quote(str(Path(trainer.default_root_dir)))
        prompt = shlex.quote(_sample_prompt(trainer))
        lines.append(f"sample from it: python generate.py --checkpoint {run} --prompt {prompt}")
        print("\n".join(lines), flush=True)


def _val_loss(trainer: L.Trainer) -> str:
    value = trainer.callback_metrics.get("val/loss")
    return (
        f" | val/loss {float(value):.4f} (nats/token, {trainer.limit_val_batches} batches)"
        if value is not None
        else ""
    )


def _score(trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
    if trainer.limit_val_batches == 0:  # validation turned off: scoring its text would be unasked-for work
        return None
    datamodule = trainer.datamodule
    tokens = getattr(datamodule, "val_tokens", None)
    tokenizer = getattr(datamodule, "tokenizer", None)
    if tokens is None or tokenizer is None or len(tokens) < 2:
        return None
    was_training = pl_module.training
    pl_module.eval()
    try:
        scores = score_validation(
            pl_module.model, tokenizer, tokens[:MAX_SCORED_TOKENS], datamodule.block_size
        )
    finally:
        pl_module.train(was_training)
    whole = len(tokens) <= MAX_SCORED_TOKENS
    scores["covered"] = "all of it" if whole else f"its first {MAX_SCORED_TOKENS:,} of {len(tokens):,} tokens"
    return scores


def _sample_prompt(trainer: L.Trainer) -> str:
    """The first non-blank prompt of the samples table (the run's own example), else a generic one."""
    for callback in trainer.callbacks:
        if isinstance(callback, SampleGenerations):
            prompts = [prompt for prompt in callback.prompts if prompt.strip()]
            if prompts:
                return prompts[0]
    return DEFAULT_PROMPT
