"""Decode speed with the KV cache against recomputing the whole context each step, in one run.

    python -m benchmarks.decode                          # random small model: 4 layers, 256 wide, 8/2 heads
    python -m benchmarks.decode --checkpoint runs/tiny   # a trained checkpoint, through generate.py's CLI path

Prompt 64 tokens, 512 new tokens, batch 1, greedy, fp32 on CPU (or --device). Prints tokens/s of both paths
and the ratio; the target is a cached path at least 10x faster.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from model import GPT, ModelConfig, generate


def tokens_per_s(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    start = time.perf_counter()
    generate(model, prompt, new_tokens, temperature=0.0, use_cache=use_cache)
    return new_tokens * prompt.shape[0] / (time.perf_counter() - start)


def bench_random_model(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=1024, block_size=1024, n_layer=4, n_head=8, n_kv_head=2, n_embd=256)
    model = GPT(config).to(args.device).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=args.device)
    tokens_per_s(model, prompt, 16, True)  # warm-up: thread pools and kernels
    results = {True: [], False: []}
    for _ in range(args.repeats):  # alternate the paths so machine noise hits both alike
        for use_cache in (True, False):
            results[use_cache].append(tokens_per_s(model, prompt, args.new_tokens, use_cache))
    cached, uncached = statistics.median(results[True]), statistics.median(results[False])
    print(f"model: {config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads / {config.n_kv_head} kv heads")
    print(f"prompt {args.prompt_len}, {args.new_tokens} new tokens, median of {args.repeats}")
    print(f"cached:    {cached:9.1f} tokens/s")
    print(f"no cache:  {uncached:9.1f} tokens/s")
    print(f"speed-up:  {cached / uncached:9.1f}x (target >= 10x)")


def bench_checkpoint(args: argparse.Namespace) -> None:
    import generate as generate_cli  # the repository's generate.py

    prompt = " ".join(["the"] * args.prompt_len)  # one token per word for a BPE trained on English text
    generate_cli.main([
        "--checkpoint", args.checkpoint, "--prompt", prompt, "--max_new_tokens", str(args.new_tokens),
        "--benchmark", "--no_cache", "--temperature", "0", "--device", args.device,
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="benchmark this checkpoint through generate.py --benchmark --no_cache")
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.checkpoint:
        bench_checkpoint(args)
    else:
        bench_random_model(args)


if __name__ == "__main__":
    main()
