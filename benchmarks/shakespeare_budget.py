"""Train the default recipe for a fixed wall-clock budget on CPU, then score the whole validation text.

    python -m benchmarks.shakespeare_budget --budget_s 150
    python -m benchmarks.shakespeare_budget --budget_s 25 --target_nats_per_char 1.88   # time to a loss

Accepts train.py's overrides; the run folder is temporary unless --out keeps it. Data is prepared before the clock
starts, as nanoGPT's prepare.py does. Validation is the last 10% of the text (nanoGPT's split), in nats per
character, which compares directly with a character-level model.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from benchmarks import QUIET, ROOT, new_parser
from data.datamodule import TextDataModule
from generation.sampling import Sampler, generate
from training import LitGPT
from training.cli import GPTCLI
from training.fit_summary import score_validation

RECIPE = ROOT / "configs" / "shakespeare.yaml"
# One seed per prompt: with a shared seed, prompts ending alike ("...:\n") drew the same continuation.
SAMPLES = [("ROMEO:", 0.0), ("JULIET:\n", 0.8), ("First Citizen:\n", 0.8)]  # (prompt, temperature)


class TimeBudget(L.Callback):
    """Stops at the budget, evaluating at a cadence if asked (off the clock). After every step max_steps (which
    LitGPT's schedule reads) becomes the step count the budget allows at the speed so far: the decay ends with it."""

    def __init__(
        self, budget_s: float, evaluate=None, every_s: float = 0.0, target: float | None = None
    ) -> None:
        self.budget_s, self.evaluate, self.every_s, self.target = budget_s, evaluate, every_s, target
        self.start, self.next_eval_s = 0.0, every_s
        self.evaluations: list[tuple[float, int, float]] = []  # (training seconds, step, val nats/char)

    def train_seconds(self) -> float:
        return time.perf_counter() - self.start

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        elapsed, step = self.train_seconds(), trainer.global_step
        if self.evaluate is not None and elapsed >= self.next_eval_s:
            self.record(elapsed, step, pl_module)
            self.next_eval_s += self.every_s
        if elapsed >= self.budget_s:
            trainer.should_stop = True
        elif step >= 20:  # the first steps are slow (allocations), so the estimate waits for them
            trainer.fit_loop.epoch_loop.max_steps = max(step + 1, round(step * self.budget_s / elapsed))

    def record(self, elapsed: float, step: int, pl_module) -> None:
        paused = time.perf_counter()
        pl_module.eval()
        nats = self.evaluate(pl_module.model)
        pl_module.train()
        self.evaluations.append((elapsed, step, nats))
        self.start += time.perf_counter() - paused

    def time_to_target(self) -> tuple[float, int] | None:
        """Training seconds and step of the first evaluation at or below the target."""
        return next(((s, step) for s, step, nats in self.evaluations if nats <= self.target), None)


def budget_parser(doc: str, budget_s: float, threads: int | None) -> argparse.ArgumentParser:
    """The flags of a budget run; train.py's overrides are the arguments `parse_known_args` leaves."""
    parser = new_parser(doc)
    add = parser.add_argument
    add("--budget_s", type=float, default=budget_s, help="training wall-clock budget in seconds")
    add("--threads", type=int, default=threads, help=f"torch threads (default: {threads or 'torch'})")
    add("--out", type=Path, default=None, help="keep the run folder under this directory (default: removed)")
    return parser


@contextlib.contextmanager
def budget_run(recipe: Path, overrides: list[str], args: argparse.Namespace, name: str):
    """train.py's CLI on `recipe` with the user's overrides, quiet, its data prepared, on --threads; the run folder
    goes under --out, or into a temporary folder removed at the end (a fine-tune's checkpoint is 1.6 GB)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = contextlib.nullcontext(str(args.out)) if args.out else None
    with kept or tempfile.TemporaryDirectory(prefix="budget-run-") as folder:
        # The start time in the name: a kept run never meets an earlier one.
        run_name = f"{name}-{args.budget_s:.0f}s-{time.strftime('%Y%m%d-%H%M%S')}"
        where = ["--trainer.default_root_dir", folder, "--run_name", run_name]
        args = ["--config", str(recipe), *overrides, *QUIET, *where]
        cli = GPTCLI(LitGPT, TextDataModule, run=False, args=args, save_config_kwargs={"overwrite": True})
        cli.datamodule.prepare_data()
        cli.datamodule.setup("fit")
        yield cli


def kept_checkpoint(trainer, out: Path | None) -> str:
    return (
        f"{trainer.checkpoint_callback.dirpath}/last.ckpt" if out else "removed (pass --out DIR to keep it)"
    )


def main() -> None:
    parser = budget_parser(__doc__, budget_s=150.0, threads=None)
    add = parser.add_argument
    add("--target_nats_per_char", type=float, default=None,
        help="evaluate every --eval_every_s seconds of training and print when this loss is first reached")  # fmt: skip
    add("--eval_every_s", type=float, default=2.5, help="evaluation cadence with a target")
    args, overrides = parser.parse_known_args()
    with budget_run(RECIPE, overrides, args, "budget") as cli:
        train_and_score(cli, args)


def train_and_score(cli: GPTCLI, args: argparse.Namespace) -> None:
    data, module, trainer = cli.datamodule, cli.model, cli.trainer

    def evaluate(model) -> float:
        return score_validation(model, data.tokenizer, data.val_tokens, data.block_size)["nats_per_char"]

    goal = args.target_nats_per_char
    budget = TimeBudget(args.budget_s, None if goal is None else evaluate, args.eval_every_s, goal)
    trainer.callbacks.append(budget)
    start = time.perf_counter()
    trainer.fit(module, data)
    train_s, wall_s = budget.train_seconds(), time.perf_counter() - start
    module.eval()
    scores = score_validation(module.model, data.tokenizer, data.val_tokens, data.block_size)
    report(module, data, trainer, train_s, wall_s, scores)
    print(f"checkpoint: {kept_checkpoint(trainer, args.out)}")
    if goal is not None:
        if not budget.evaluations or budget.evaluations[-1][1] != trainer.global_step:
            budget.evaluations.append((train_s, trainer.global_step, scores["nats_per_char"]))
        print("evaluations (training s, step, val nats/char): " + ", ".join(
        f"({s:.1f}, {step}, {nats:.4f})" for s, step, nats in budget.evaluations))  # fmt: skip
        reached, target = budget.time_to_target(), f"target {args.target_nats_per_char} nats/char"
        if reached is None:
            print(f"{target}: not reached in {args.budget_s:.0f} s")
        else:
            print(f"{target}: reached after {reached[0]:.1f} s of training (step {reached[1]}; evaluated every "
                  f"{args.eval_every_s} s)")  # fmt: skip


def report(module, data, trainer, train_s: float, wall_s: float, scores: dict) -> None:
    steps = trainer.global_step
    tokens_per_s = steps * data.batch_size * data.block_size / train_s
    print(f"val_nats_per_char: {scores['nats_per_char']:.4f}")
    print(f"val_bpb: {scores['bpb']:.4f}   val_nats_per_token: {scores['nats_per_token']:.4f}")
    print(f"train: {steps} steps in {train_s:.1f} s, {tokens_per_s:,.0f} tokens/s, "
          f"{tokens_per_s * data.chars_per_token:,.0f} chars/s ({wall_s:.1f} s wall with evaluations)")  # fmt: skip
    print(f"params: {module.model.num_params():,}   vocab: {data.tokenizer.vocab_size}   "
          f"block: {data.block_size}   batch: {data.batch_size}")  # fmt: skip
    tokenizer, model = data.tokenizer, module.model
    for seed, (prompt, temperature) in enumerate(SAMPLES):
        ids, generator = torch.tensor([tokenizer.encode(prompt)]), torch.Generator().manual_seed(seed)
        out = generate(
            model, ids, 60, sampler=Sampler(temperature=temperature, top_k=50, generator=generator)
        )
        kind = "greedy" if temperature == 0 else f"T={temperature}"
        print(f"--- {kind}: {prompt!r}\n{tokenizer.decode(out[0].tolist())}")


if __name__ == "__main__":
    main()
