"""Does a 2-layer GQA model trained on repeated random segments form an induction head, and when?

    python -m benchmarks.induction --threads 2            # defaults: 2 layers, 4/2 heads, 64 wide, 3000 steps
    python -m benchmarks.induction --steps 300 --eval_every 50 --threads 1   # a quick look (no head yet)

Random tokens have no n-gram statistics: the only way to beat ln(vocab) on a repeated segment is to copy what
followed the current token's earlier occurrence, an induction head. Expect a plateau, then a sudden drop of the
copy-2 loss (the phase change) after about 1300-1600 steps with the defaults. Every --eval_every steps: the loss
on each copy of held-out repeated segments, and per layer the best head's induction and previous-token scores;
the verdict names the first evaluation where an induction score exceeds --threshold.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks import model_shape, new_parser
from inspection.attention_stats import PhaseChangeDetector, head_statistics, repeated_random_tokens
from model import GPT, ModelConfig
from training.schedule import adamw_param_groups


def repeat_batch(args: argparse.Namespace, generator: torch.Generator) -> torch.Tensor:
    """(B, block_size + 1) random ids, each row holding a segment repeated right after itself; tiled, up to the
    row's end (with one repeat no head had formed by step 600). The period varies per row: with a fixed one, a
    head could attend to the offset period - 1 through RoPE and score as an induction head."""
    block, batch = args.block_size, args.batch_size
    tokens = torch.randint(args.vocab_size, (batch, block + 1), generator=generator)  # (B, T + 1)
    lengths = torch.randint(args.min_period, args.max_period + 1, (batch,), generator=generator)  # (B,)
    for row, period in enumerate(lengths.tolist()):
        # Random noise before the segment makes the repeat's absolute position vary too.
        start = int(torch.randint(block + 2 - 2 * period, (1,), generator=generator))
        for pos in range(start + period, block + 1 if args.tile else start + 2 * period):
            tokens[row, pos] = tokens[row, pos - period]
    return tokens


def copy_losses(model: GPT, repeated: torch.Tensor, period: int) -> tuple[float, float]:
    """Mean loss on the first copy and on the second copy of a (B, 2 * period) repeated sequence."""
    logits = model(repeated[:, :-1])  # (B, 2P - 1, V)
    losses = F.cross_entropy(logits.transpose(1, 2), repeated[:, 1:], reduction="none")  # (B, 2P - 1)
    # Position t predicts token t + 1: t < P - 1 stays in the first copy, t >= P predicts a repeated token
    # whose predecessor already occurred (t = P - 1 predicts the repeat's first token, which has no cue).
    return losses[:, : period - 1].mean().item(), losses[:, period:].mean().item()


@torch.no_grad()
def evaluate(model: GPT, args: argparse.Namespace) -> dict:
    """Copy losses and per-head scores on the same held-out sequences, averaged over several periods: on one, a
    positional head on key t - period + 1 scores like an induction head; over several, only token matching does."""
    model.eval()
    probe = torch.randint(
        args.vocab_size, (args.eval_batch, args.block_size), generator=_generator(args.seed - 1)
    )
    probe_maps = model.attention_maps(probe)  # (L, B, H, T, T), shared by every period
    results = []
    for i, period in enumerate(args.eval_periods):
        seed = args.seed + 1_000_003 + i  # no training batch draws from these seeds
        # Generators seeded alike: the copy losses and head_statistics' induction score see the same tokens.
        repeated = repeated_random_tokens(args.vocab_size, period, args.eval_batch, _generator(seed))
        stats = head_statistics(model, probe, period, args.eval_batch, _generator(seed), probe_maps)
        results.append((*copy_losses(model, repeated, period), stats["induction"]))
    model.train()
    firsts, seconds, inductions = zip(*results, strict=True)
    return {"first": statistics.mean(firsts), "second": statistics.mean(seconds),
            "induction": torch.stack(inductions).mean(dim=0), "previous": stats["previous_token"]}  # fmt: skip


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def format_row(step: int, elapsed: float, train_loss: float, result: dict) -> str:
    cells = [f"{step:6d}", f"{elapsed:6.1f}", f"{train_loss:6.3f}"]
    cells += [f"{result['first']:6.3f}", f"{result['second']:6.3f}"]
    for name in ("induction", "previous"):
        best, head = result[name].max(dim=1)  # (L,), best head per layer
        cells += [f"{score:.2f}(h{h})" for score, h in zip(best.tolist(), head.tolist(), strict=True)]
    return "  ".join(cells)


def header(n_layer: int) -> str:
    cells = ["  step", "  time", " train", " copy1", " copy2"]
    cells += [f"ind L{layer}  " for layer in range(n_layer)] + [f"prev L{layer} " for layer in range(n_layer)]
    return "  ".join(cells)


def verdict(history: list[tuple[int, dict]], detector: PhaseChangeDetector, args: argparse.Namespace) -> str:
    last_step, last = history[-1]
    gap = f"at step {last_step}: copy2 loss {last['second']:.3f} vs copy1 {last['first']:.3f}"
    if not detector.formations:
        best = last["induction"].max().item()
        return f"no induction head by step {last_step} (best score {best:.2f} <= threshold {args.threshold}); {gap}"
    # The first evaluation where some head beats the threshold, and its strongest head then.
    first = detector.formations[0]
    step, layer, head, score = first.step, first.layer, first.head, first.score
    group = head // (args.n_head // args.n_kv_head)  # GQA: heads of one group share their keys and values
    previous = dict(history)[step]["previous"]
    prev_layer = int(previous.max(dim=1).values.argmax())
    prev_score, prev_head = previous[prev_layer].max(dim=0)
    return (f"induction head formed at step {step} (layer {layer} head {head}, kv group {group}, score "
            f"{score:.2f} > threshold {args.threshold}; strongest previous-token head then: layer {prev_layer} "
            f"head {int(prev_head)}, {prev_score:.2f}); {gap}, that head's score "
            f"{last['induction'][layer, head]:.2f}")  # fmt: skip


def run(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    model = GPT(ModelConfig(**model_shape(args)))
    optimizer = torch.optim.AdamW(adamw_param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    # Linear warmup then constant: a decaying rate would slow a phase change that may come late.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))
    generator = torch.Generator().manual_seed(args.seed)
    print(f"model: {args.n_layer} layers, {args.n_embd} wide, {args.n_head} heads / "
          f"{args.n_kv_head} kv heads, vocab {args.vocab_size}, block {args.block_size}, batch {args.batch_size}, lr {args.lr}; train "
          f"periods {(args.min_period, args.max_period)} (tile {args.tile}), eval periods {args.eval_periods}; "
          f"ln(vocab) = {math.log(args.vocab_size):.3f}")  # fmt: skip
    print(header(args.n_layer))
    history, recent, start = [], [], time.perf_counter()
    detector = PhaseChangeDetector(args.threshold)  # one line per head, at the evaluation where it crosses
    for step in range(1, args.steps + 1):
        tokens = repeat_batch(args, generator)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        recent.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            result = evaluate(model, args)
            history.append((step, result))
            elapsed = time.perf_counter() - start
            print(format_row(step, elapsed, sum(recent) / len(recent), result), flush=True)
            for formation in detector.update(step, result["induction"]):
                print(formation.message(), flush=True)
            recent = []
    print(verdict(history, detector, args))


def main() -> None:
    parser = new_parser(__doc__, vocab_size=256, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    add = parser.add_argument
    add("--steps", type=int, default=3000, help="optimizer steps")
    add("--eval_every", type=int, default=100, help="steps between evaluations")
    add("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    add("--seed", type=int, default=0, help="seed of the weights and the training batches")
    add("--batch_size", type=int, default=32, help="sequences per step")
    add("--lr", type=float, default=3e-3, help="AdamW learning rate after warmup")
    add("--warmup", type=int, default=50, help="optimizer steps of linear warmup; constant after")
    add("--weight_decay", type=float, default=0.1, help="AdamW weight decay (matrices only)")
    add("--min_period", type=int, default=8, help="shortest repeated segment in training")
    add("--max_period", type=int, default=32, help="longest repeated segment in training (<= (block+1)/2)")
    add("--eval_periods", type=lambda text: tuple(map(int, text.split(","))), default=(8, 12, 16, 24, 32),
        help="comma-separated held-out periods")  # fmt: skip
    add("--no_tile", dest="tile", action="store_false", help="repeat a segment once, not up to the row's end")
    add("--eval_batch", type=int, default=8, help="held-out sequences per evaluation period")
    add("--threshold", type=float, default=0.5, help="induction score that counts as an induction head")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not 1 <= args.min_period <= args.max_period or 2 * args.max_period > args.block_size + 1:
        parser.error("need 1 <= --min_period <= --max_period and 2 * --max_period <= --block_size + 1")
    if min(args.eval_periods) < 2 or 2 * max(args.eval_periods) > args.block_size:
        parser.error("need every --eval_periods value in [2, --block_size / 2]")
    run(args)


if __name__ == "__main__":
    main()
