"""A static-shape decode step: one graph for every position, so it can be compiled once.

The eager path slices the `KVCache` to `[:pos + T]`, so every step has a new key length. Here the same forward
runs over a `StaticCache`, whose position is a tensor: a step writes its key/value at `pos`, selects its RoPE
rows there, and attends over the whole buffer with a mask hiding the positions after `pos`. Shapes never
change, so `torch.compile(fullgraph=True)` builds one graph (on CUDA, replayed as a CUDA graph). Prefill stays
eager, into the `KVCache` whose buffers the static cache shares.

On the CPU the step asks for reductions: its one-query attention (`one_query_attention`, model/attention.py)
is the C++ op of model/row_kernel.cpp in float32 (it reads only the visible positions) and otherwise products
and sums that Inductor fuses into reductions reading each cached key once on every thread, and its one-row
float32 linear layers call the C++ kernel's product (`OneRowLinears`); torch's
matrix-vector product reads a weight that does not fit in cache at about one core's bandwidth
(`python -m benchmarks.decode_vs_hf`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from .cache import KVCache, StaticLayer
from .gpt import GPT, OneRowLinears
from .quantized import float_rows_op


class StaticCache:
    """The buffers of a `KVCache` seen at a tensor position `pos` (set by `StaticDecoder` before each step),
    one token per forward: a layer's `update` returns its whole buffers (B, Hkv, max_len, D), `visible` masks
    them."""

    def __init__(self, cache: KVCache, reductions: bool = False, one_region: bool = True) -> None:
        device = cache.k.device
        self.reductions = reductions
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        cos, sin = cache.rope.tables(0, cache.max_len, device)
        self.cos, self.sin = cos.clone(), sin.clone()  # own tables: the shared ones are views of a bigger one
        key_pos = torch.arange(cache.max_len, device=device)
        # One view per layer rather than the stacked (L, ...) buffers: a write through a view of one stacked
        # graph input made the compiled graph copy the whole cache at every step; separate inputs are written
        # in place.
        self._layers = [
            StaticLayer(k, v, self.pos, key_pos, reductions, one_region)
            for k, v in zip(cache.k.unbind(0), cache.v.unbind(0), strict=True)
        ]

    def rope_rows(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        if t != 1:
            raise ValueError(
                f"the static cache takes one token per forward, got {t}; prefill into the KVCache"
            )
        return self.cos.index_select(0, self.pos), self.sin.index_select(0, self.pos)  # (1, D)

    def layers(self) -> list[StaticLayer]:
        return self._layers

    def advance(self, n_tokens: int) -> None:
        """Nothing: the decoder sets `pos` between steps. Moving it inside the step would mutate a graph
        input, which keeps CUDA graphs from replaying."""


def decode_step(model: GPT, token: torch.Tensor, cache: StaticCache) -> torch.Tensor:
    """Logits (B, V) of one token (B, 1) at the cache's position: the model's own forward. With
    `cache.reductions` (the compiled CPU step) its one-row linear layers and its attention are reductions."""
    with OneRowLinears() if cache.reductions else contextlib.nullcontext():
        return model(token, cache, last_only=True)[:, -1]


class StaticDecoder:
    """Runs the model's forward over a `StaticCache` of the caller's `KVCache` (written in place by prefill
    and every step), eagerly or compiled with `backend` ("aot_eager" only traces: quick, for tests); inductor
    on CUDA replays CUDA graphs ("reduce-overhead")."""

    def __init__(self, model: GPT, cache: KVCache, compile: bool = True, backend: str = "inductor") -> None:
        self.model, self.cache = model, cache
        self.key: tuple = ()
        self.on_cuda = cache.k.device.type == "cuda"
        reductions = compile and cache.k.device.type == "cpu"
        if reductions:
            float_rows_op()  # loaded (or built) now: the step's linear layers call it, a kept step too
        # aot_eager (quick tests) inlines every block: its kept graph of a region that writes its inputs fails
        # to run once loaded (torch 2.13: "'HopSchema' object has no attribute 'tree_spec'"); inductor's runs.
        self.static = StaticCache(cache, reductions, one_region=backend != "aot_eager")
        self.step = decode_step
        if compile:
            mode = "reduce-overhead" if backend == "inductor" and self.on_cuda else None
            # A static address lets the CUDA graph keep pointing at the caller's buffers across replays.
            torch._dynamo.mark_static_address(cache.k)
            torch._dynamo.mark_static_address(cache.v)
            # Every cache length, model shape and batch size is one more graph of this one function: dynamo's
            # default limit of 8 per function would end a long process (a test run, a sweep) with a hard error.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            # enable_aot_compile: the step also gets `aot_compile`, for `compile_ahead`.
            with torch._dynamo.config.patch(enable_aot_compile=True):
                self.step = torch.compile(
                    decode_step, fullgraph=True, dynamic=False, backend=backend, mode=mode
                )
        self.compiled_on_call = self.step  # compiled at its first call; `use` may replace the step

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Forget the cache, feed idx (B, T) through the eager forward and return the last logits (B, V).

        Eager even for a model compiled in place (`model.compile()`): that graph would specialise on the position.
        """
        self.cache.reset()
        with torch.compiler.set_stance("force_eager"):
            return self.model(idx, self.cache, last_only=True)[:, -1]

    @torch.inference_mode()  # as `generate` runs it: a step built in another grad mode would be rebuilt
    def warm_up(self) -> None:
        """Build the compiled step now (one step at position 0 of the emptied cache), not at the first token."""
        self.cache.reset()
        self.static.pos.fill_(0)
        token = torch.zeros(self.cache.k.shape[1], 1, dtype=torch.long, device=self.cache.k.device)
        self.step(self.model, token, self.static)

    @torch.inference_mode()
    def compile_ahead(self) -> Callable:
        """Trace and compile the step now, for the examples of `warm_up`, into a function that decodes from now on
        and that torch can save (`AOTCompiledFunction.serialize`) and load in another process
        (`torch.compiler.load_compiled_function`, then `use`) without tracing again."""
        token = torch.zeros(self.cache.k.shape[1], 1, dtype=torch.long, device=self.cache.k.device)
        self.use(self.compiled_on_call.aot_compile(((self.model, token, self.static), {})))
        self.warm_up()  # its kernels loaded now, not at the first token
        return self.step

    def use(self, step: Callable) -> None:
        """Decode with `step`, built by `compile_ahead` (here or in another process) for this model and shape.

        Its guards are off: loaded in a fresh process, torch's saved guards refused the cache's tensors (a
        dispatch key check), and this decoder's batch size, dtype, device and length are the ones it was built
        for (the caller's key says so).
        """
        step.disable_guard_check()
        self.step = step

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at the cache's position; the logits (B, V) of the next token."""
        if self.cache.pos >= self.cache.max_len:
            raise ValueError(
                f"KVCache is full at position {self.cache.pos}; reset it or allocate a longer one"
            )
        self.static.pos.fill_(self.cache.pos)
        logits = self.step(self.model, token[:, None], self.static)
        self.cache.advance(1)
        # A CUDA graph reuses its output buffer on the next replay, so the caller gets its own copy.
        return logits.clone() if self.on_cuda else logits


def static_cache_length(length: int, block_size: int) -> int:
    """The static cache's length for `length` positions: a power of two, at least 256, at most block_size.

    Each step attends over the whole buffer, so a block_size-long one (8192 for SmolLM2) would read as many
    bytes per token as the weights for a short request. Rounding to a power of two keeps the number of
    compiled graphs, one per length, down to log2(block_size / 256) + 1.
    """
    length = min(length, block_size)
    return min(block_size, max(256, 1 << (length - 1).bit_length()))


def static_decoder(
    model: GPT, batch_size: int, backend: str = "inductor", length: int | None = None
) -> StaticDecoder:
    """The compiled decoder of `model` for this batch size, dtype and device, kept by the model between calls.

    Its cache holds `static_cache_length(length)` positions (`length`: prompt + new tokens; None: block_size).
    A second `generate` call that fits neither recompiles nor allocates. A longer request, or a new batch size,
    dtype, device or backend, replaces it (and compiles once more for a shape not seen yet).
    """
    param = next(model.parameters())
    decoder = getattr(model, "static_decoder", None)  # a plain attribute: not a submodule, not in state_dict
    key = (batch_size, param.dtype, param.device, backend)
    block_size = model.config.block_size
    max_len = static_cache_length(block_size if length is None else length, block_size)
    if decoder is None or decoder.key != key or decoder.cache.max_len < max_len:
        cache = KVCache.for_model(model, batch_size, max_len)
        decoder = StaticDecoder(model, cache, compile=True, backend=backend)
        decoder.key = key
        model.static_decoder = decoder
    return decoder
