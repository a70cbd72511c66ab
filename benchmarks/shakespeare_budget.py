"""Train the default recipe for a fixed wall-clock budget on CPU, then score the whole validation text.

    python -m benchmarks.shakespeare_budget --budget_s 150

Accepts train.py's overrides (`--config`, `--model.*`, `--data.*`, `--trainer.*`). Data preparation (tokenizer
training, tokenization) happens before the clock starts, as nanoGPT's prepare.py does. The learning-rate
schedule is laid out over the steps that fit the budget: during the stable phase the step count is
re-estimated from the measured speed, and frozen once the final decay starts.

Validation is the last 10% of the text by characters (the classic nanoGPT split). Every validation token after
the first is scored with non-overlapping windows of block_size; nats per character = total nats / characters
those tokens cover, which compares directly with a character-level model's loss.
"""

from __future__ import annotations

import argparse
import math
import time

import lightning as L
import torch
import torch.nn.functional as F

from data.datamodule import TextDataModule
from model import generate
from training import LitGPT
from training.cli import GPTCLI


class TimeBudget(L.Callback):
    """Stops at the budget and keeps trainer.max_steps at the step count the budget allows."""

    def __init__(self, budget_s: float, decay_fraction: float) -> None:
        self.budget_s, self.decay_fraction = budget_s, decay_fraction
        self.start = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        elapsed, step = time.perf_counter() - self.start, trainer.global_step
        if elapsed >= self.budget_s:
            trainer.should_stop = True
        elif step >= 20 and step < (1 - self.decay_fraction) * trainer.max_steps:
            trainer.fit_loop.epoch_loop.max_steps = max(step + 1, int(step * self.budget_s / elapsed))


@torch.no_grad()
def score_validation(model, tokenizer, tokens, block_size: int) -> dict[str, float]:
    """Total nats over every validation token but the first, per token, per character and per byte."""
    ids = torch.from_numpy(tokens.astype("int64"))
    nats, count = 0.0, 0
    for start in range(0, len(ids) - 1, block_size):
        window = ids[start : start + block_size + 1]
        logits = model(window[None, :-1])
        nats += F.cross_entropy(logits[0].float(), window[1:], reduction="sum").item()
        count += len(window) - 1
    text = tokenizer.decode(ids[1:].tolist())
    return {
        "nats_per_token": nats / count,
        "nats_per_char": nats / len(text),
        "bpb": nats / math.log(2) / len(text.encode("utf-8")),
        "chars": len(text),
        "tokens": count,
    }


def build(overrides: list[str], budget_s: float):
    run_name = f"budget-{budget_s:.0f}s-{time.strftime('%Y%m%d-%H%M%S')}"
    args = [
        "--config",
        "configs/shakespeare.yaml",
        *overrides,
        "--trainer.logger",
        "false",
        "--trainer.limit_val_batches",
        "0",
        "--samples.every_n_steps",
        "0",
        "--attention_maps.every_n_steps",
        "0",
        "--trainer.enable_progress_bar",
        "false",
        "--run_name",
        run_name,
    ]
    return GPTCLI(LitGPT, TextDataModule, run=False, args=args, save_config_kwargs={"overwrite": True})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget_s", type=float, default=150.0, help="training wall-clock budget in seconds")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args, overrides = parser.parse_known_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cli = build(overrides, args.budget_s)
    data, module, trainer = cli.datamodule, cli.model, cli.trainer
    data.prepare_data()
    data.setup("fit")
    trainer.callbacks.append(TimeBudget(args.budget_s, module.hparams.decay_fraction))
    start = time.perf_counter()
    trainer.fit(module, data)
    train_s = time.perf_counter() - start
    module.eval()
    scores = score_validation(module.model, data.tokenizer, data.val_tokens, data.block_size)
    report(module, data, trainer, train_s, scores)


def report(module, data, trainer, train_s: float, scores: dict) -> None:
    steps = trainer.global_step
    tokens_per_s = steps * data.batch_size * data.block_size / train_s
    print(f"val_nats_per_char: {scores['nats_per_char']:.4f}")
    print(f"val_bpb: {scores['bpb']:.4f}   val_nats_per_token: {scores['nats_per_token']:.4f}")
    print(
        f"train: {steps} steps in {train_s:.1f} s, {tokens_per_s:,.0f} tokens/s, "
        f"{tokens_per_s * data.chars_per_token:,.0f} chars/s"
    )
    print(
        f"params: {module.model.num_params():,}   vocab: {data.tokenizer.vocab_size}   "
        f"block: {data.block_size}   batch: {data.batch_size}"
    )
    print(f"checkpoint: {trainer.checkpoint_callback.dirpath}/last.ckpt")
    tokenizer, model = data.tokenizer, module.model
    for seed, (prompt, temperature) in enumerate(
        [("ROMEO:", 0.0), ("JULIET:\n", 0.8), ("First Citizen:\n", 0.8)]
    ):
        ids = torch.tensor([tokenizer.encode(prompt)])
        # One seed per prompt: with a shared seed, prompts ending alike ("...:\n") drew the same continuation.
        out = generate(
            model, ids, 60, temperature=temperature, top_k=50, generator=torch.Generator().manual_seed(seed)
        )
        kind = "greedy" if temperature == 0 else f"T={temperature}"
        print(f"--- {kind}: {prompt!r}\n{tokenizer.decode(out[0].tolist())}")


if __name__ == "__main__":
    main()
