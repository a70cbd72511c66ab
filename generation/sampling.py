"""Autoregressive decoding: how a token is picked (`Sampler`) and the one decode loop (`decode`) that plain,
compiled, speculative (generation/speculative.py) and chat (generation/chat.py) decoding share, with its one stop
rule (`Stop`) and window rule (`context_start`, kept by `Context`). `generate` is its plain and compiled use."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from common.errors import UserError
from model.cache import KVCache

from .non_finite import first_non_finite
from .static_decode import static_decoder


class NonFiniteLogits(UserError):
    """The model's next-token logits hold a NaN or an infinity, so no token can be drawn."""


NOT_FINITE = "the model's output is not finite (NaN or infinite logits)"


@dataclass(frozen=True)
class Sampler:
    """How a token is picked from logits: greedy when temperature == 0, else drawn from a filtered softmax.

    Filters apply in order: repetition penalty (raw logits), temperature, top-k, top-p (nucleus), min-p.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        """A value that cannot sample is a one-line UserError naming the field."""
        for name in ("temperature", "repetition_penalty"):  # NaN passes every comparison below
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"top_k must be at least 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise UserError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise UserError(f"repetition_penalty must be positive, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """The distribution (..., V) tokens are drawn from (one-hot on the argmax when greedy); the repetition
        penalty discourages the tokens `seen` (B, T) so far (logits (B, V) then)."""
        if seen is not None and self.repetition_penalty != 1.0:
            logits = penalize_repeats(logits, seen, self.repetition_penalty)
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        flat = logits.reshape(-1, logits.shape[-1]).float()
        # Less the row's best first, so the top logit is 0 and a tiny temperature gives 0 and -inf (greedy), not
        # inf - inf = NaN; one below float32's smallest normal would round to 0 (0 / 0 = NaN): it is that one.
        temperature = max(self.temperature, torch.finfo(torch.float32).tiny)
        flat = (flat - flat.max(-1, keepdim=True).values) / temperature
        return filter_logits(flat, self.top_k, self.top_p, self.min_p).softmax(-1).view(logits.shape)

    def next_token(self, logits: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """One token id per row of logits (B, V), given the tokens `seen` (B, T) so far."""
        if self.greedy and (seen is None or self.repetition_penalty == 1.0):
            return logits.argmax(dim=-1)  # the common greedy case stays one kernel
        probs = self.probs(logits, seen)
        return probs.argmax(dim=-1) if self.greedy else self._multinomial(probs, logits).squeeze(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token id from a distribution (V,) made by `probs` (the argmax when greedy)."""
        return int(probs.argmax() if self.greedy else self._multinomial(probs, probs))

    def _multinomial(self, probs: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        try:
            return torch.multinomial(probs, 1, generator=self.generator)
        except RuntimeError:  # `source` checked only now: checking every step would wait for the device
            if torch.isfinite(source).all():
                raise
            raise NonFiniteLogits(NOT_FINITE) from None


GREEDY = Sampler(temperature=0.0)


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
    """First token of the window the model sees, given the previous window start and the sequence length: every
    decoder's one rule. A full window jumps to keep the most recent block_size // 2 tokens (at least one), so
    the cache is re-filled once per block_size / 2 tokens rather than at every token."""
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


class Stop:
    """The one stop rule: a row ends at its first stop id (`eos_id`: one or several), then repeats the first of
    the ids; decoding ends when every row has stopped."""

    def __init__(self, eos_id: int | Collection[int] | None, batch_size: int, device: torch.device) -> None:
        ids = [] if eos_id is None else [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]
        self.ids = torch.tensor(ids, device=device) if ids else None
        self.first = ids[0] if ids else None
        self.done = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def apply(self, tokens: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The columns (B, n') to keep of a step's `tokens` (B, n), and whether every row has now stopped."""
        if self.ids is None:
            return tokens, False
        hits = torch.isin(tokens, self.ids).long()
        stopped = self.done[:, None] | (hits.cumsum(1) > 0)  # (B, n): the row has emitted a stop by then
        before = self.done[:, None] | (hits.cumsum(1) - hits > 0)  # the row stopped before this column
        tokens = tokens.masked_fill(before, self.first)
        self.done = stopped[:, -1]
        if not bool(self.done.all()):  # a device sync: once per step, and only when there are stop ids
            return tokens, False
        return tokens[:, : int(stopped.all(0).long().argmax()) + 1], True


class Context:
    """A model's view of a growing sequence (B, n): the KV cache of its current window (`context_start`), fed
    only the tokens it lacks, one token through `step` (the compiled static step) if given, else the eager
    forward. Without a cache it runs the whole window every time (the reference)."""

    def __init__(self, model: torch.nn.Module, cache: KVCache | None, step=None) -> None:
        self.model, self.cache, self.step = model, cache, step
        self.block_size = model.config.block_size
        self.start: int | None = None  # the sequence index at cache position 0; None until the first call

    def logits(self, seq: torch.Tensor, count: int = 1) -> torch.Tensor:
        """Logits (B, count, V) of the token after each of the last `count` prefixes of seq (B, n); the shortest
        decides the window, the caller keeps the longest inside it."""
        start = self.window_start(seq.shape[1] - count + 1)
        if start != self.start:
            self.start = start
            if self.cache is not None:
                self.cache.reset()
        if self.cache is None:
            return self.eager(seq[:, start:], None, count)
        self.keep(seq.shape[1] - count)  # what the cache holds from there on was a rejected draft
        new = seq[:, start + self.cache.pos :]
        if new.shape[1] == 1 and count == 1 and self.step is not None:
            return self.step(new[:, 0].clone(memory_format=torch.contiguous_format))[:, None]  # one graph
        return self.eager(new, self.cache, count)

    def window_start(self, n: int) -> int:
        if self.start is None:  # a long prompt: the model sees its last block_size tokens
            return max(0, n - self.block_size)
        return context_start(self.start, n, self.block_size)

    def eager(self, tokens: torch.Tensor, cache: KVCache | None, count: int) -> torch.Tensor:
        # Eager even for a model compiled in place (`model.compile()`, as training with `compile: true` does):
        # that graph specialises on the cache position and would be rebuilt at every step. Nothing is compiled
        # before torch._dynamo is imported, and importing it is 1.4 s of a plain run's start.
        compiled = "torch._dynamo" in sys.modules
        with torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext():
            return self.model(tokens, cache, last_only=count == 1)[:, -count:]

    def keep(self, n: int) -> None:
        """The first n tokens of the sequence are final; forget any cached after them (a re-rendered chat)."""
        if self.cache is not None and self.start is not None and n - self.start < self.cache.pos:
            self.cache.rollback(max(0, n - self.start))


def decode(
    seq: torch.Tensor,
    max_new_tokens: int,
    next_tokens: Callable[[torch.Tensor, int], torch.Tensor],
    stop: Stop,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """The one decode loop: extend seq (B, n) by `next_tokens(seq, room)` columns (B, k), 1 <= k <= room (one
    for a plain step, several for a speculative round) until max_new_tokens or a stop; `on_token` receives each
    new column (B,) as soon as it is kept."""
    start = seq.shape[1]
    while seq.shape[1] - start < max_new_tokens:
        tokens, finished = stop.apply(next_tokens(seq, max_new_tokens - (seq.shape[1] - start)))
        seq = torch.cat([seq, tokens], dim=1)
        if on_token is not None:
            for column in tokens.unbind(1):
                on_token(column)
        if finished:
            break
    return seq


def sample_step(context: Context, sampler: Sampler) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The plain step of `decode`: one token per row, picked by `sampler` from the context's logits."""
    check = first_finite()

    def step(seq: torch.Tensor, room: int) -> torch.Tensor:
        logits = check(context.logits(seq)[:, -1])
        return sampler.next_token(logits, seq)[:, None]

    return step


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int | Collection[int] | None = None,
    use_cache: bool = True,
    compile: bool = False,
    on_token: Callable[[torch.Tensor], None] | None = None,
    sampler: Sampler = Sampler(),
) -> torch.Tensor:
    """Continue idx (B, T) by up to max_new_tokens tokens and return (B, T + new) token ids.

    `sampler` picks each token (`GREEDY`, or e.g. `Sampler(temperature=0.8, top_p=0.9)`). `eos_id` is one stop
    id or several (`Stop`). `on_token` receives each new column (B,) as soon as it is chosen. The model runs from
    a KV cache; `use_cache=False` recomputes the window every step (the reference); `compile=True` decodes with
    the static-shape step of generation/static_decode.py, compiled by `static_decode.BACKEND`.
    """
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if compile and not use_cache:
        raise UserError("compile=True needs use_cache=True: the compiled step decodes from the KV cache")
    batch, length = idx.shape[0], idx.shape[1] + max_new_tokens  # a short request reads a short cache
    if compile:  # generation/static_decode.py: one compiled graph for every position
        decoder = static_decoder(model, batch, length)
        context = Context(model, decoder.cache, decoder.decode)
    else:
        context = Context(model, KVCache.for_model(model, batch, length) if use_cache else None)
    stop = Stop(eos_id, batch, idx.device)
    with naming_the_broken_layer(model, idx):
        return decode(idx, max_new_tokens, sample_step(context, sampler), stop, on_token)


def first_finite() -> Callable[[torch.Tensor], torch.Tensor]:
    """A pass-through that raises NonFiniteLogits if the first logits it sees are not finite: broken weights
    are broken from the first token, and greedy picking would turn NaN into token ids in silence."""
    checked = False

    def check(logits: torch.Tensor) -> torch.Tensor:
        nonlocal checked
        if not checked and not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogits(NOT_FINITE)
        checked = True
        return logits

    return check


@contextlib.contextmanager
def naming_the_broken_layer(model: torch.nn.Module, idx: torch.Tensor):
    """NonFiniteLogits raised inside, told which module's output on idx is first not finite."""
    try:
        yield
    except NonFiniteLogits as err:
        raise NonFiniteLogits(f"{err}; first at {first_non_finite(model, idx)}") from None
