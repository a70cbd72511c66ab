"""Training tokens/s of the Lightning step (LitGPT + Trainer) against a bare PyTorch loop, in one run.

    python -m benchmarks.train_throughput --threads 2                     # 150 steps, 7 rounds of each
    python -m benchmarks.train_throughput --steps 12 --warmup 3 --repeats 1 --threads 1   # a quick look

Both sides train the same model from the same initialisation on the same batches, on the CPU; the bare loop does
per step what LitGPT + Trainer do, so the difference is Lightning's own per-step work (logging, the finite-loss
check, hooks). Rounds alternate the sides; a whole run's speed moves by 10-20% on a shared machine, so the overhead
is the median of each round's (bare - lightning) / bare tokens/s (target under 5%). The losses should agree.
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import time
import warnings

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from benchmarks import model_shape, new_parser
from benchmarks.lightning_checks import QUIET_TRAINER, StepLog
from data.batches import TrainBatches
from training import LitGPT
from training.cli import retain_freed_memory
from training.schedule import lr_multiplier

# The optimizer and schedule of configs/shakespeare.yaml; the model shape comes from the arguments.
RECIPE = {"learning_rate": 3e-3, "weight_decay": 0.1, "warmup_steps": 50, "schedule": "wsd",
          "decay_fraction": 0.3, "min_lr_ratio": 0.05}  # fmt: skip


def batches(tokens: np.ndarray, args: argparse.Namespace) -> DataLoader:
    return DataLoader(TrainBatches(tokens, args.block_size, args.batch_size, seed=args.seed), batch_size=None)


def run_lightning(
    module: LitGPT, tokens: np.ndarray, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """Step end times and losses of `args.steps` steps of Trainer.fit (timed after the scheduler step)."""
    clock = StepLog(accumulate=1)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", enable_checkpointing=False, callbacks=[clock],
                        **QUIET_TRAINER)  # fmt: skip
    trainer.fit(module, train_dataloaders=batches(tokens, args))
    return clock.times, clock.losses


def run_bare(module: LitGPT, tokens: np.ndarray, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """The same steps as run_lightning without Lightning: step end times and losses."""
    module.train()
    hp, optimizer = module.hparams, module.make_optimizer()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(
        step, args.steps, hp.warmup_steps, hp.schedule, hp.min_lr_ratio, hp.decay_fraction))  # fmt: skip
    params = [p for group in optimizer.param_groups for p in group["params"]]
    times, losses = [], []
    for step, (x, y) in enumerate(batches(tokens, args)):
        if step == args.steps:
            break
        loss = module.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())  # Lightning reads the loss every step too (finite check, logging)
        times.append(time.perf_counter())
    return times, losses


def measure(args: argparse.Namespace) -> dict[str, list[tuple[float, list[float], float]]]:
    """Alternating rounds: per side a list of (tokens/s, losses, minor page faults per step)."""
    tokens = np.random.default_rng(args.seed).integers(
        0, args.vocab_size, args.stream_tokens, dtype=np.uint16
    )
    results = {"lightning": [], "bare": []}
    runners = {"lightning": run_lightning, "bare": run_bare}
    # One model for every run, reset to the same initial weights in place: the parameters then keep their
    # memory addresses, one less difference between runs that moves their speed.
    torch.manual_seed(args.seed)
    module = LitGPT(**model_shape(args), mlp_hidden=args.mlp_hidden, **RECIPE)
    initial = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    timed = (args.steps - args.warmup) * args.batch_size * args.block_size  # tokens after the warm-up steps
    for round_index in range(args.repeats):
        # Alternate which side goes first too, so a slow start of a round does not always hit the same side.
        order = ("lightning", "bare") if round_index % 2 == 0 else ("bare", "lightning")
        for side in order:
            module.load_state_dict(initial)
            module.zero_grad(set_to_none=True)  # a Lightning run ends with the last step's gradients in place
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times, losses = runners[side](module, tokens, args)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / args.steps
            results[side].append((timed / (times[-1] - times[args.warmup - 1]), losses, faults))
            print(f"round {round_index + 1} {side:9s} {results[side][-1][0]:9.0f} tokens/s, {faults:6.0f} page "
                  "faults/step", flush=True)  # fmt: skip
    return results


def report(results: dict[str, list[tuple[float, list[float], float]]], args: argparse.Namespace) -> None:
    speed = {side: statistics.median(run[0] for run in results[side]) for side in results}
    faults = {side: statistics.median(run[2] for run in results[side]) for side in results}
    lit_losses, bare_losses = results["lightning"][0][1], results["bare"][0][1]
    per_round = [(b[0] - li[0]) / b[0] for li, b in zip(results["lightning"], results["bare"], strict=True)]
    overhead = statistics.median(per_round)
    print(f"model: {args.n_layer} layers, {args.n_embd} wide, {args.n_head} heads / "
          f"{args.n_kv_head} kv heads, vocab {args.vocab_size}; batch {args.batch_size} x {args.block_size} tokens; "
          f"torch threads {torch.get_num_threads()}; "
          f"{'glibc default malloc' if args.default_allocator else 'freed memory retained as in train.py'}")  # fmt: skip
    print(f"steps {args.steps}, timed after step {args.warmup}; median of {args.repeats} rounds")
    tokens_per_step = args.batch_size * args.block_size
    for side in ("lightning", "bare"):
        print(f"{side + ':':10s} {speed[side]:9.0f} tokens/s ({1000 * tokens_per_step / speed[side]:7.1f} ms/step, "
              f"{faults[side]:.0f} page faults/step)")  # fmt: skip
    print("overhead per round: " + ", ".join(f"{100 * o:.1f}%" for o in per_round))
    print(f"overhead:  {100 * overhead:8.2f} % of bare tokens/s, median of the rounds "
          f"(target < 5%): {'PASS' if overhead < 0.05 else 'FAIL'}")  # fmt: skip
    print(f"first-step loss: lightning {lit_losses[0]:.6f}, bare {bare_losses[0]:.6f}, "
          f"|diff| {abs(lit_losses[0] - bare_losses[0]):.2e}")  # fmt: skip
    worst = max(abs(a - b) for a, b in zip(lit_losses, bare_losses, strict=True))
    print(f"last-step loss:  lightning {lit_losses[-1]:.6f}, bare {bare_losses[-1]:.6f}; "
          f"max |diff| over all {len(lit_losses)} steps {worst:.2e}")  # fmt: skip


def main() -> None:
    parser = new_parser(__doc__, vocab_size=1024, block_size=64, n_layer=3, n_head=4, n_kv_head=2, n_embd=128)
    add = parser.add_argument
    add("--steps", type=int, default=150, help="optimizer steps per run")
    add("--warmup", type=int, default=5, help="steps left out of the timing at the start of each run")
    add("--repeats", type=int, default=7, help="rounds; each trains the same initial model on each side")
    add("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    add("--seed", type=int, default=0, help="seed of the weights and the batches")
    add("--batch_size", type=int, default=8, help="sequences per step")
    add("--mlp_hidden", type=int, default=256, help="SwiGLU hidden width")
    add("--default_allocator", action="store_true", help="glibc's malloc thresholds (train.py changes them)")
    add("--stream_tokens", type=int, default=2_000_000, help="length of the random token stream")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.steps:
        parser.error("need 1 <= --warmup < --steps")
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.default_allocator:
        retain_freed_memory()
    # Lightning's banner and advice would bury the table: both sides read batches in the main process (no
    # workers), validation is off on purpose, and LeafSpec is Lightning's own deprecation.
    for logger in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    for message in ("does not have many workers", "no `val_dataloader`", "LeafSpec"):
        warnings.filterwarnings("ignore", message=f".*{message}.*")
    report(measure(args), args)


if __name__ == "__main__":
    main()
