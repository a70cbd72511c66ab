"""Autoregressive sampling: how a token is picked (`Sampler`), and `generate`, which prefills once and then
decodes one token at a time from the KV cache.

Plain, compiled and speculative decoding all pick their tokens with the same `Sampler`, and all follow the
same context-window rule (`context_start`), so they agree token for token wherever they should.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from common.errors import UserError

from .cache import KVCache
from .static_decode import static_decoder


@dataclass(frozen=True)
class Sampler:
    """How a token is picked from logits: greedy when temperature == 0, else drawn from a filtered softmax.

    The filters apply in this order: repetition penalty (on the raw logits), temperature, then top-k, top-p
    (nucleus) and min-p; `generator` makes the draws reproducible.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generator: torch.Generator | None = None

    def check(self, prefix: str = "") -> Sampler:
        """Raise a one-line UserError for a value that cannot sample; `prefix="--"` names command-line flags."""
        if self.temperature < 0:
            raise UserError(f"{prefix}temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"{prefix}top_k must be at least 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise UserError(f"{prefix}top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise UserError(f"{prefix}min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise UserError(f"{prefix}repetition_penalty must be positive, got {self.repetition_penalty}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """The distribution (..., V) tokens are drawn from; one-hot on the argmax when greedy.

        `seen` (B, T), the tokens so far, is what the repetition penalty discourages (logits (B, V) then).
        """
        if seen is not None and self.repetition_penalty != 1.0:
            logits = penalize_repeats(logits, seen, self.repetition_penalty)
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        flat = logits.reshape(-1, logits.shape[-1]).float() / self.temperature
        return filter_logits(flat, self.top_k, self.top_p, self.min_p).softmax(-1).view(logits.shape)

    def next_token(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """One token id per row of logits (B, V), given the tokens `seen` (B, T) so far."""
        if self.greedy and (seen is None or self.repetition_penalty == 1.0):
            return logits.argmax(dim=-1)  # no softmax needed, the common greedy case stays one kernel
        probs = self.probs(logits, seen)
        if self.greedy:
            return probs.argmax(dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token id from a distribution (V,) made by `probs` (the argmax when greedy)."""
        if self.greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        """A number in [0, 1) from the sampler's generator (speculative decoding's accept test)."""
        return float(torch.rand((), generator=self.generator))


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


def context_start(start: int, length: int, block_size: int) -> int:
    """First token of the window the model sees, given the previous window start and the sequence length.

    The window grows until it holds block_size tokens; when the next token would not fit, the window jumps
    forward so that the most recent block_size // 2 tokens remain (at least one, for block_size 1) and are
    re-encoded from position 0. Jumping by half (instead of by one) lets the cached path re-prefill once per
    block_size / 2 tokens. Every decoder (plain, no cache, compiled, speculative and its draft model) follows
    this one rule, so they agree at every length.
    """
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


class CachedDecoder:
    """Eager decoding from a `KVCache`: prefill a window, then one single-token forward per step."""

    def __init__(self, model: torch.nn.Module, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    # Eager even for a model compiled in place (`model.compile()`, as training with `compile: true` does):
    # that graph specialises on the cache position and would be rebuilt at every step.
    @torch.compiler.set_stance("force_eager")
    def prefill(self, window: torch.Tensor) -> torch.Tensor:
        """The next-token logits (B, V) after `window` (B, T), encoded into the emptied cache."""
        self.cache.reset()
        return self.model(window, self.cache, last_only=True)[:, -1]

    @torch.compiler.set_stance("force_eager")
    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,); the logits (B, V) of the next one."""
        return self.model(token[:, None], self.cache)[:, -1]


class RecomputingDecoder:
    """No cache: every step runs the whole window again (the reference the cached paths are tested against)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.window = model, None

    @torch.compiler.set_stance("force_eager")
    def prefill(self, window: torch.Tensor) -> torch.Tensor:
        self.window = window
        return self.model(window, last_only=True)[:, -1]

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        return self.prefill(torch.cat([self.window, token[:, None]], dim=1))


def make_decoder(
    model: torch.nn.Module, batch_size: int, use_cache: bool, compile: bool | str, length: int | None = None
):
    """The decoder `generate` asks for: an object with `prefill(window)` and `decode(token)`, both -> logits.

    `length` (prompt + new tokens; None: block_size) sizes the cache: a short request reads a short one.
    """
    if compile and not use_cache:
        raise UserError("compile=True needs use_cache=True: the compiled step decodes from the KV cache")
    if compile:  # model/static_decode.py: one compiled graph for every position
        return static_decoder(model, batch_size, "inductor" if compile is True else compile, length)
    if not use_cache:
        return RecomputingDecoder(model)
    param = next(model.parameters())
    config = model.config
    # A request that fits never slides its window, so it never writes past `length`.
    max_len = min(config.block_size, length or config.block_size)
    cache = KVCache.allocate(config, batch_size, max_len, device=param.device, dtype=param.dtype)
    return CachedDecoder(model, cache)


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int | Collection[int] | None = None,
    use_cache: bool = True,
    compile: bool | str = False,
    on_token: Callable[[torch.Tensor], None] | None = None,
    sampler: Sampler | None = None,
    **sampling,
) -> torch.Tensor:
    """Continue idx (B, T) by up to max_new_tokens tokens and return (B, T + new) token ids.

    How tokens are picked: a `Sampler`, or its fields as keywords (temperature=1.0, top_k, top_p, min_p,
    repetition_penalty, generator); `temperature=0` is greedy. `eos_id` is one stop id or several (models
    such as Llama 3 end a turn with more than one); a row that emits one then repeats the first, and decoding
    stops when every row has. `on_token` receives each new column (B,) as soon as it is chosen.

    How the model runs: from a KV cache, prefilled once, one single-token forward per new token; with
    `use_cache=False` the whole window is recomputed every step (the reference the cache is tested against);
    `compile=True` decodes with the static-shape step of model/static_decode.py compiled by inductor (a string
    names another `torch.compile` backend): the same tokens, one graph for every position.
    """
    if sampler is not None and sampling:
        raise TypeError(f"pass a Sampler or its fields, not both (got sampler and {sorted(sampling)})")
    sampler = (sampler or Sampler(**sampling)).check()
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    block_size = model.config.block_size
    decoder = make_decoder(model, idx.shape[0], use_cache, compile, idx.shape[1] + max_new_tokens)
    start = max(0, idx.shape[1] - block_size)  # a long prompt: the model sees its last block_size tokens
    logits = decoder.prefill(idx[:, start:])
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    stop = stop_ids(eos_id, idx.device)
    for step in range(max_new_tokens):
        token = sampler.next_token(logits, idx)
        if stop is not None:
            token = token.masked_fill(done, int(stop[0]))
            done |= torch.isin(token, stop)
        idx = torch.cat([idx, token[:, None]], dim=1)
        if on_token is not None:
            on_token(token)
        # done.all() syncs with the device, so it is only asked when an eos can have been emitted.
        if step == max_new_tokens - 1 or (stop is not None and bool(done.all())):
            break
        new_start = context_start(start, idx.shape[1], block_size)
        if new_start == start:
            logits = decoder.decode(token)
        else:  # the window jumped: encode its recent half from position 0
            start = new_start
            logits = decoder.prefill(idx[:, start:])
    return idx


def stop_list(eos_id: int | Collection[int] | None) -> list[int]:
    """The stop ids, first one first; empty when decoding never stops early."""
    if eos_id is None:
        return []
    return [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]


def stop_ids(eos_id: int | Collection[int] | None, device: torch.device) -> torch.Tensor | None:
    """The stop ids as a tensor (first one first), or None when decoding never stops early."""
    ids = stop_list(eos_id)
    return torch.tensor(ids, device=device) if ids else None
