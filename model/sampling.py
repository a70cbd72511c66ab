"""Autoregressive sampling: prefill once, then decode one token at a time from the KV cache."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from common.errors import UserError

from .cache import KVCache
from .static_decode import static_decoder


def filter_logits(
    logits: torch.Tensor,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """Set to -inf every logit (B, V) outside the top-k, the top-p nucleus and the min-p floor."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if min_p is not None and min_p > 0.0:
        probs = logits.softmax(dim=-1)
        floor = min_p * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty: shrink the logits (B, V) of tokens already in `seen` (B, T) towards less likely."""
    picked = logits.gather(-1, seen)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(-1, seen, picked)


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """One token id per row of logits (B, V): argmax when temperature == 0, else a filtered sample."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p, min_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def context_start(start: int, length: int, block_size: int) -> int:
    """First token of the window the model sees, given the previous window start and the sequence length.

    The window grows until it holds block_size tokens; when the next token would not fit, the window jumps
    forward so that the most recent block_size // 2 tokens remain and are re-encoded from position 0.
    Jumping by half (instead of by one) lets the cached path re-prefill once per block_size / 2 tokens, and
    both paths of `generate` follow this same rule, so they agree at every length.
    """
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    on_token: Callable[[torch.Tensor], None] | None = None,
    compile: bool | str = False,
) -> torch.Tensor:
    """Continue idx (B, T) by up to max_new_tokens tokens and return (B, T + new) token ids.

    With `use_cache` the prompt is prefilled once and each new token costs one single-token forward; with
    `use_cache=False` the whole window is recomputed every step (the reference the cache is tested
    against). Rows that emit `eos_id` keep emitting it; decoding stops when every row has. `on_token`
    receives each new column (B,) as soon as it is chosen, for streaming.

    `compile=True` decodes with the static-shape step of model/static_decode.py compiled by inductor (a
    string names another `torch.compile` backend); the same tokens, one graph for every position. Otherwise the
    model runs eagerly, even one compiled in place with `model.compile()`, and so does `on_token`.
    """
    check_sampling_args(max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty)
    if compile and not use_cache:
        raise UserError("compile=True needs use_cache=True: the compiled step decodes from the KV cache")
    block_size = model.config.block_size
    start = max(0, idx.shape[1] - block_size)
    decoder = (
        static_decoder(model, idx.shape[0], "inductor" if compile is True else compile) if compile else None
    )
    cache = decoder.cache if decoder else None
    if use_cache and not decoder:
        dtype = next(model.parameters()).dtype
        cache = KVCache.allocate(model.config, idx.shape[0], block_size, device=idx.device, dtype=dtype)

    def prefill(window: torch.Tensor) -> torch.Tensor:
        """The next-token logits (B, V) after `window` (B, T), encoded into the emptied cache."""
        if decoder:
            return decoder.prefill(window)
        if cache is not None:
            cache.reset()
        return model(window, cache, last_only=True)[:, -1]

    # The eager path runs a model compiled in place (`model.compile()`, as training with `compile: true` does)
    # eagerly: that graph specialises on the cache position and would be rebuilt at every step.
    with contextlib.nullcontext() if decoder else torch.compiler.set_stance("force_eager"):
        logits = prefill(idx[:, start:])
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        for step in range(max_new_tokens):
            if repetition_penalty != 1.0:
                logits = penalize_repeats(logits, idx, repetition_penalty)
            token = sample_next(logits, temperature, generator, top_k, top_p, min_p)
            if eos_id is not None:
                token = token.masked_fill(done, eos_id)
                done |= token == eos_id
            idx = torch.cat([idx, token[:, None]], dim=1)
            if on_token is not None:
                on_token(token)
            # done.all() syncs with the device, so it is only asked when an eos can have been emitted.
            if step == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
                break
            new_start = context_start(start, idx.shape[1], block_size)
            if cache is not None and new_start == start:
                logits = decoder.decode(token) if decoder else model(token[:, None], cache)[:, -1]
                continue
            start = new_start
            logits = prefill(idx[:, start:])
    return idx


def check_sampling_args(
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    repetition_penalty: float,
    prefix: str = "",
) -> None:
    """Raise a one-line UserError for a value `generate` cannot use; `prefix="--"` names command-line flags."""
    if max_new_tokens < 1:
        raise UserError(f"{prefix}max_new_tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise UserError(f"{prefix}temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"{prefix}top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise UserError(f"{prefix}top_p must be in (0, 1], got {top_p}")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise UserError(f"{prefix}min_p must be in [0, 1], got {min_p}")
    if repetition_penalty <= 0:
        raise UserError(f"{prefix}repetition_penalty must be positive, got {repetition_penalty}")
