"""A static-shape decode step: one graph for every position, so it can be compiled once.

The eager path slices the `KVCache` to `[:pos + T]`, so every step has a new key length. Here the model's own
forward runs over a `StaticCache`, whose position is a tensor: a step writes its key/value at `pos`, selects its
RoPE rows there, and attends over the whole buffer with a mask hiding the positions after `pos` (`StaticLayer`,
the one hook the network offers: a layer cache's `attend`). Shapes never change, so
`torch.compile(fullgraph=True)` builds one graph (on CUDA, replayed as a CUDA graph). Prefill stays eager, into
the `KVCache` whose buffers the static cache shares.

On the CPU the step asks for reductions: its one-query attention is the C++ op of cpu_kernels/row_kernel.cpp in
float32 (it reads only the visible positions) and otherwise products and sums that Inductor fuses into reductions
reading each cached key once on every thread, and its one-row float32 linear layers call the C++ kernel's
product (`OneRowLinears`): torch's matrix-vector product reads a weight that does not fit in cache at about one
core's bandwidth (`python -m benchmarks.decode_vs_hf`). Every block is compiled once and its graph reused for all
layers (`_block_region`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from cpu_kernels.library import attention_op, float_rows_op
from model.cache import KVCache
from model.gpt import GPT, Block

# The compiler backend of `static_decoder` (what generate(compile=True) and --compile use); tests set a quicker one.
BACKEND = "inductor"


class OneRowLinears(TorchFunctionMode):
    """A one-row `F.linear` (CPU) as the C++ kernel's float32 product (cpu_kernels/row_kernel.cpp: it reads the
    weight at about the machine's bandwidth), or else as a product and a sum for Inductor to fuse into one
    reduction.

    Only meant inside a compiled step: run eagerly, the product would be materialised before the sum. More
    rows keep the matrix product, where the GEMM kernel is the better choice.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not kwargs and 2 <= len(args) <= 3 and args[0].shape[:-1].numel() == 1:
            x, weight = args[:2]
            if x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and float_rows_op():
                out = float_rows_op()(x, weight)
            else:
                out = (x.unsqueeze(-2) * weight).sum(-1)
            return out if len(args) == 2 or args[2] is None else out + args[2]
        return func(*args, **kwargs)


def one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v for one query per head, q (B, H, 1, D), over k, v (B, Hkv, S, D) masked by
    `visible` (B or 1, 1, 1, S), as products and sums for Inductor to fuse into reductions that read each cached
    key once on every thread; run eagerly it would materialise the products. Scores are at least float32, as in
    the fused kernel. In float32 on the CPU, the C++ op of cpu_kernels/row_kernel.cpp computes the same, reading
    only the visible positions."""
    if q.dtype == k.dtype == v.dtype == torch.float32 and q.device.type == "cpu" and attention_op():
        return attention_op()(q, k, v, visible)
    b, h, _, d = q.shape
    hkv = k.shape[1]
    q = q.to(torch.promote_types(q.dtype, torch.float32))  # bf16/fp16 -> float32, float64 stays
    q = q.view(b, hkv, h // hkv, 1, d)  # (B, Hkv, G, 1, D): the query heads of each key head
    scores = (q * k.unsqueeze(2)).sum(-1) / d**0.5  # (B, Hkv, G, S)
    scores = scores.masked_fill(~visible.view(visible.shape[0], 1, 1, -1), float("-inf"))
    out = (scores.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(-2)  # (B, Hkv, G, Dv)
    return out.to(v.dtype).reshape(b, h, 1, v.shape[-1])


class StaticLayer(NamedTuple):
    """One layer of the static cache at a tensor position: plain tensors and a flag, so the step traces one
    block and reuses its graph for every layer (`_block_region`): nothing in it says which layer it is."""

    k: torch.Tensor  # (B, Hkv, max_len, D), a view of the KVCache's buffer
    v: torch.Tensor
    pos: torch.Tensor  # (1,) long: the position written, shared by the layers
    key_pos: torch.Tensor  # (max_len,) arange
    reductions: bool  # the one query as explicit reductions (the compiled CPU step)

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Write the token's key and value at `pos`; attend over the whole buffer, the later positions masked."""
        self.k.index_copy_(2, self.pos, k_new)
        self.v.index_copy_(2, self.pos, v_new)
        visible = (self.key_pos <= self.pos).view(1, 1, 1, -1)  # (1, 1, 1, S)
        if self.reductions:
            return one_query_attention(q, self.k, self.v, visible)
        return F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=visible, enable_gqa=True)


@torch.compiler.nested_compile_region
def _block_region(
    block: Block,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor,
    key_pos: torch.Tensor,
    reductions: bool,
) -> torch.Tensor:
    """A block under torch.compile traced and lowered once, its graph reused for every layer whose weights and
    cache have the same shapes (torch checks that); a plain call when not compiling. Its inputs are a module,
    tensors and a flag, nothing naming the layer; passed one by one, torch checks them without flattening
    a tuple (that check would add a guard a kept step cannot save)."""
    # Inside the region the caller's modes are off: it asks for the step's one-row reductions itself.
    with OneRowLinears() if reductions else contextlib.nullcontext():
        return block(x, cos, sin, StaticLayer(k, v, pos, key_pos, reductions))


class _RegionBlock(nn.Module):
    """A block called through `_block_region`, as the model's forward calls its blocks."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, cos, sin, layer: StaticLayer, probs_out=None) -> torch.Tensor:
        return _block_region(self.block, x, cos, sin, *layer)


def one_region_per_block(model: GPT) -> GPT:
    """The model seen with each block behind `_block_region`: the same parameters and the same forward, a
    compiled step of it lowers one block instead of n_layer."""
    view = copy.copy(model)  # shares the parameters, buffers and submodules; only its block list differs
    view._modules = {**model._modules, "blocks": nn.ModuleList(_RegionBlock(b) for b in model.blocks)}
    return view


class StaticCache:
    """The buffers of a `KVCache` seen at a tensor position `pos` (set by `StaticDecoder` before each step),
    one token per forward, each layer a `StaticLayer`."""

    def __init__(self, cache: KVCache, reductions: bool = False) -> None:
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
            StaticLayer(k, v, self.pos, key_pos, reductions)
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
        self.static = StaticCache(cache, reductions)
        # aot_eager (quick tests) inlines every block: its kept graph of a region that writes its inputs fails
        # to run once loaded (torch 2.13: "'HopSchema' object has no attribute 'tree_spec'"); inductor's runs.
        self.stepping = one_region_per_block(model) if compile and backend != "aot_eager" else model
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
        self.step(self.stepping, token, self.static)

    @torch.inference_mode()
    def compile_ahead(self) -> Callable:
        """Trace and compile the step now, for the examples of `warm_up`, into a function that decodes from now on
        and that torch can save (`AOTCompiledFunction.serialize`) and load in another process
        (`torch.compiler.load_compiled_function`, then `use`) without tracing again."""
        token = torch.zeros(self.cache.k.shape[1], 1, dtype=torch.long, device=self.cache.k.device)
        self.use(self.compiled_on_call.aot_compile(((self.stepping, token, self.static), {})))
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
        self.cache.check_room(1)
        self.static.pos.fill_(self.cache.pos)
        logits = self.step(self.stepping, token[:, None], self.static)
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


def cache_length(block_size: int, length: int, compiled: bool) -> int:
    """Positions the KV cache of a `generate` call holds for `length` (prompt + new tokens): what it needs,
    eagerly; rounded up to the static cache's length by the compiled step. Nothing is allocated to know it."""
    return static_cache_length(length, block_size) if compiled else min(length, block_size)


def static_decoder(model: GPT, batch_size: int, length: int | None = None) -> StaticDecoder:
    """The compiled decoder of `model` for this batch size, dtype and device, kept by the model between calls.

    Its cache holds `static_cache_length(length)` positions (`length`: prompt + new tokens; None: block_size).
    A second `generate` call that fits neither recompiles nor allocates. A longer request, or a new batch size,
    dtype, device or BACKEND, replaces it (and compiles once more for a shape not seen yet).
    """
    backend = BACKEND
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
