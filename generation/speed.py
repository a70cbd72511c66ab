"""What `generate.py --benchmark` prints: the KV cache's size, prefill and decode speed, and for speculative
decoding its speed-up over plain decoding. Figures are medians over alternating runs (generation/timing.py); each
run samples with a generator seeded alike and never stops at an end-of-text token, so all decode the same tokens.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

import torch

from generation.sampling import Sampler, generate
from generation.speculative import Drafter, speculative_generate
from generation.static_decode import cache_length
from model.cache import cache_bytes

from .text import TextStream
from .timing import alternate_medians, synchronize, wall_seconds

REPEATS = 5
# A prefill of a handful of tokens is over in microseconds, dominated by fixed costs: its tokens/s swings
# from tens to thousands and says nothing about the model. Below this prompt length only its time is shown.
MIN_PREFILL_TOKENS = 32


def seeded(sampler: Sampler, seed: int, device: torch.device) -> Sampler:
    """The sampler with a fresh generator seeded with `seed`: every run draws the same tokens."""
    return dataclasses.replace(sampler, generator=torch.Generator(device=device).manual_seed(seed))


def timed_decode(
    model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, **kwargs
) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s) of one `generate` call: the first new token's arrival ends the prefill,
    and decode speed counts the other new_tokens - 1 tokens of every row."""
    stamps = [time.perf_counter()]

    def arrived(_: torch.Tensor) -> None:
        if len(stamps) == 1:  # the prefill's end: wait for the device before reading the clock
            synchronize()
        stamps.append(time.perf_counter())

    generate(model, prompt, new_tokens, on_token=arrived, **kwargs)
    synchronize()
    stamps[-1] = time.perf_counter()
    decode_s = stamps[-1] - stamps[1]
    return stamps[1] - stamps[0], prompt.shape[0] * (new_tokens - 1) / decode_s if decode_s else float("inf")


def report_decode_speed(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    sampler: Sampler | None = None,
    seed: int = 0,
    *,
    compile: bool = False,
    with_recompute: bool = False,
    repeats: int = REPEATS,
) -> dict[str, float]:
    """Print the cache size and, for the eager cached path (and the compiled step, recomputing the window),
    prefill time and decode tokens/s, and the speed-ups; return the tokens/s."""
    sampler = sampler or Sampler(temperature=0.0)
    config, batch, element = model.config, prompt.shape[0], next(model.parameters()).element_size()
    sizes = []
    for path, compiled in [("eager", False), ("compiled step", True)] if compile else [("eager", False)]:
        # The positions generate's cache holds on that path.
        positions = cache_length(config.block_size, prompt.shape[1] + new_tokens, compiled)
        mib = batch * cache_bytes(config, positions, element) / 2**20
        sizes.append(f"{mib:.2f} MiB for {batch} x {positions} tokens ({path})")
    print(f"KV cache: {cache_bytes(config, 1, element)} bytes per token per sequence, {', '.join(sizes)}")

    def run(**kwargs) -> Callable[[], tuple[float, float]]:
        return lambda: timed_decode(
            model, prompt, new_tokens, sampler=seeded(sampler, seed, prompt.device), **kwargs
        )

    runs = {"cached": run()}
    if compile:
        runs["compiled"] = run(compile=True)
    if with_recompute:
        runs["no_cache"] = run(use_cache=False)
    medians = alternate_medians(runs, repeats)
    for name, (prefill_s, decode_tps) in medians.items():
        print(f"{name:>8}: {prefill_line(prompt.shape[1], prefill_s)}, decode {decode_tps:,.1f} tokens/s")
    cached = medians["cached"][1]
    if "compiled" in medians:
        print(
            f"decode speed-up of the compiled step over the eager one: {medians['compiled'][1] / cached:.2f}x"
        )
    if "no_cache" in medians:
        print(f"decode speed-up from the KV cache: {cached / medians['no_cache'][1]:.1f}x")
    print(f"(medians of {repeats} alternating runs, {new_tokens} new tokens, batch {prompt.shape[0]})")
    return {name: decode_tps for name, (_, decode_tps) in medians.items()}


def prefill_line(prompt_len: int, seconds: float) -> str:
    """The prefill's time, and its tokens/s only for a prompt long enough for the rate to mean something."""
    line = f"prefill {prompt_len} tokens in {seconds * 1000:.1f} ms"
    if prompt_len >= MIN_PREFILL_TOKENS:
        return f"{line} ({prompt_len / seconds:,.0f} tokens/s)"
    return f"{line} (too short for a rate: tokens/s needs a prompt of {MIN_PREFILL_TOKENS}+ tokens)"


def report_speculative_speed(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    make_drafter: Callable[[], Drafter],
    sampler: Sampler,
    seed: int,
    *,
    k: int,
    repeats: int = REPEATS,
) -> None:
    """Print speculative and plain tokens/s, the acceptance rate, and whether both gave the same tokens."""
    outputs: dict[str, object] = {}

    def speculative():
        fresh = seeded(sampler, seed, prompt.device)
        return speculative_generate(model, prompt, new_tokens, make_drafter(), k=k, sampler=fresh)

    def plain():
        return generate(model, prompt, new_tokens, sampler=seeded(sampler, seed, prompt.device))

    runs = {
        name: wall_seconds(fn, outputs, name) for name, fn in [("speculative", speculative), ("plain", plain)]
    }
    seconds = alternate_medians(runs, repeats)
    out, stats = outputs["speculative"]
    print(
        f"speculative: {stats.new_tokens / seconds['speculative']:.1f} tokens/s, acceptance {stats.acceptance:.0%} "
        f"({stats.accepted}/{stats.drafted}), {stats.target_forwards} target forwards"
    )
    print(f"plain:       {new_tokens / seconds['plain']:.1f} tokens/s")
    speed_up = seconds["plain"] / seconds["speculative"] * stats.new_tokens / new_tokens
    print(
        f"speed-up:    {speed_up:.2f}x, same tokens: {torch.equal(out, outputs['plain'])} "
        f"(medians of {repeats} alternating runs)"
    )


def speculative_run(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    drafter: Drafter,
    stream: TextStream,
    **kwargs,
) -> None:
    """`speculative_generate` printing its tokens through `stream`, then one stderr line with counts and speed."""
    start = time.perf_counter()
    _, stats = speculative_generate(model, prompt, new_tokens, drafter, on_token=stream, **kwargs)
    seconds = time.perf_counter() - start
    stream.finish()
    print()
    print(f"[{stats.new_tokens} tokens, {stats.target_forwards} target forwards, acceptance "
          f"{stats.acceptance:.0%}, {stats.new_tokens / seconds:.1f} tokens/s]", file=sys.stderr)  # fmt: skip
