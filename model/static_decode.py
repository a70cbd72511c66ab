"""A static-shape decode step: one graph for every position, so it can be compiled once.

The eager path (`GPT.forward` with a `KVCache`) slices the cache to `[:pos + T]`, so every step has a new key
length and a compiled graph would be rebuilt (or made dynamic) as the position moves. Here the position is a
tensor: a step writes its key/value at `pos` with `index_copy_` and attends over the whole fixed-length buffer
with a mask that hides the positions after `pos`. Shapes never change, so `torch.compile(fullgraph=True)`
builds one graph, and on CUDA `mode="reduce-overhead"` replays it as a CUDA graph.

Prefill stays eager (`GPT.forward` into the same `KVCache` buffers); only the one-token step is compiled.

On the CPU the compiled step writes its one-row linear layers (batch 1) and its one-query attention (every batch)
as multiplies and sums (`ReductionKernels`), which Inductor fuses into reductions that read each weight or cached
key once on every thread: torch's matrix-vector product reads a weight that does not fit in cache at about the
bandwidth of one core, and the fused attention kernel is built for many queries, not one
(`python -m benchmarks.decode_vs_hf` and `python -m benchmarks.decode --batches 1 8 32` measure them).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .cache import KVCache
from .gpt import GPT
from .rope import rope_tables


class StaticStepCache:
    """The view of a `KVCache` that one static step hands to the attention layers.

    `update` writes the new key/value (B, Hkv, 1, D) at the tensor position and returns the whole buffers
    (B, Hkv, max_len, D); `visible` is the bool mask (1, 1, 1, max_len) of the positions written so far.
    """

    def __init__(
        self,
        k: tuple[torch.Tensor, ...],
        v: tuple[torch.Tensor, ...],
        pos: torch.Tensor,
        visible: torch.Tensor,
    ) -> None:
        self.k, self.v, self.pos, self.visible = k, v, pos, visible

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k[layer].index_copy_(2, self.pos, k)
        self.v[layer].index_copy_(2, self.pos, v)
        return self.k[layer], self.v[layer]


def static_step(
    model: GPT,
    token: torch.Tensor,
    pos: torch.Tensor,
    k: tuple[torch.Tensor, ...],
    v: tuple[torch.Tensor, ...],
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
) -> torch.Tensor:
    """Logits (B, V) of one token (B, 1) at position `pos` (1,), writing its keys/values into k, v.

    k, v hold one full buffer (B, Hkv, max_len, D) per layer; cos/sin tables cover every position (max_len, D).
    Mirrors `GPT._run` with the position as a tensor.
    """
    cos, sin = cos_table.index_select(0, pos), sin_table.index_select(0, pos)  # (1, D)
    key_pos = torch.arange(k[0].shape[2], device=pos.device)
    cache = StaticStepCache(k, v, pos, (key_pos <= pos).view(1, 1, 1, -1))  # (1, 1, 1, S)
    x = model.wte(token)  # (B, 1, C)
    for block in model.blocks:
        x = block(x, cos, sin, cache)
    return model.lm_head(model.norm(x))[:, -1]  # (B, V)


class ReductionKernels(TorchFunctionMode):
    """Writes a one-row `F.linear` and a one-query masked attention as multiplies and sums, for Inductor to fuse.

    Only meant inside a compiled step: run eagerly, the products would be materialised before the sums.
    A linear layer of more than one row keeps the matrix product, where the GEMM kernel is the better choice.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not kwargs and (len(args) == 2 or args[2] is None):
            x, weight = args[:2]
            if x.shape[:-1].numel() == 1:
                return (x.unsqueeze(-2) * weight).sum(-1)
        if func is F.scaled_dot_product_attention and len(args) == 3 and args[0].shape[2] == 1:
            mask = kwargs.get("attn_mask")
            if (
                kwargs.keys() == {"attn_mask", "enable_gqa"}
                and kwargs["enable_gqa"] is True
                and mask is not None
                and mask.dtype == torch.bool
                and mask.dim() == 4
                and mask.shape[1:3] == (1, 1)
            ):
                return one_query_attention(*args, mask)
        return func(*args, **kwargs)


def one_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v for one query per head, q (B, H, 1, D), over k, v (B, Hkv, S, D).

    `visible` is a bool mask (B or 1, 1, 1, S). Each key head serves its group of query heads without being
    repeated. Scores and probabilities are at least float32, as in the fused kernel, for bf16 and fp16 models.
    """
    b, h, _, d = q.shape
    hkv = k.shape[1]
    q = q.to(torch.promote_types(q.dtype, torch.float32))  # bf16/fp16 -> float32, float64 stays
    q = q.view(b, hkv, h // hkv, 1, d)  # (B, Hkv, G, 1, D): the query heads of each key head
    scores = (q * k.unsqueeze(2)).sum(-1) / d**0.5  # (B, Hkv, G, S)
    scores = scores.masked_fill(~visible.view(visible.shape[0], 1, 1, -1), float("-inf"))
    out = (scores.softmax(-1).unsqueeze(-1) * v.unsqueeze(2)).sum(-2)  # (B, Hkv, G, Dv)
    return out.to(v.dtype).reshape(b, h, 1, v.shape[-1])


def static_step_reductions(*step_args) -> torch.Tensor:
    """`static_step` (same arguments) with its one-row linear layers and its attention written as reductions."""
    with ReductionKernels():
        return static_step(*step_args)


class StaticDecoder:
    """Runs `static_step` on a `KVCache`, compiled or eager; eager prefill fills the same buffers.

    Args:
        model: the GPT, in eval mode.
        cache: the caller's cache; its buffers are written in place by prefill and by every step.
        compile: wrap the step in `torch.compile(fullgraph=True, dynamic=False)`.
        backend: the compile backend; "inductor" generates kernels, "aot_eager" only traces (quick, for tests).
        mode: the compile mode; None picks "reduce-overhead" (CUDA graphs) on CUDA with inductor.
    """

    def __init__(
        self,
        model: GPT,
        cache: KVCache,
        compile: bool = True,
        backend: str = "inductor",
        mode: str | None = None,
    ) -> None:
        self.model, self.cache = model, cache
        self.key: tuple = ()
        config = model.config
        cos, sin = rope_tables(config.head_dim, 0, cache.max_len, config.rope_theta, cache.k.device)
        self.cos, self.sin = (
            cos.clone(),
            sin.clone(),
        )  # own tables: the shared ones are views of a bigger cache
        self.pos = torch.zeros(1, dtype=torch.long, device=cache.k.device)
        # The step gets one view per layer rather than the stacked (L, ...) buffers: a write through a view of
        # one stacked graph input made the compiled graph copy the whole cache at every step; separate inputs
        # are written in place.
        self.k_layers, self.v_layers = cache.k.unbind(0), cache.v.unbind(0)
        self.on_cuda = cache.k.device.type == "cuda"
        self.step = static_step
        if compile:
            if mode is None and backend == "inductor" and self.on_cuda:
                mode = "reduce-overhead"
            # A static address lets the CUDA graph keep pointing at the caller's buffers across replays.
            torch._dynamo.mark_static_address(cache.k)
            torch._dynamo.mark_static_address(cache.v)
            step = static_step_reductions if cache.k.device.type == "cpu" else static_step
            self.step = torch.compile(step, fullgraph=True, dynamic=False, backend=backend, mode=mode)

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Forget the cache, feed idx (B, T) through the eager forward and return the last logits (B, V).

        Eager even for a model compiled in place (`model.compile()`): that graph would specialise on the position.
        """
        self.cache.reset()
        with torch.compiler.set_stance("force_eager"):
            return self.model(idx, self.cache, last_only=True)[:, -1]

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at the cache's position; the logits (B, V) of the next token."""
        if self.cache.pos >= self.cache.max_len:
            raise ValueError(
                f"KVCache is full at position {self.cache.pos}; reset it or allocate a longer one"
            )
        self.pos.fill_(self.cache.pos)
        logits = self.step(
            self.model, token[:, None], self.pos, self.k_layers, self.v_layers, self.cos, self.sin
        )
        self.cache.advance(1)
        # A CUDA graph reuses its output buffer on the next replay, so the caller gets its own copy.
        return logits.clone() if self.on_cuda else logits


_DECODERS: weakref.WeakKeyDictionary[GPT, StaticDecoder] = weakref.WeakKeyDictionary()


def static_decoder(model: GPT, batch_size: int, backend: str = "inductor") -> StaticDecoder:
    """The compiled decoder of `model` for this batch size, dtype and device, kept between `generate` calls.

    Reusing it keeps one cache and one compiled graph: a second `generate` call neither recompiles nor
    allocates. A new batch size, dtype, device or backend replaces it (and compiles once more). Dynamo keeps
    at most `torch._dynamo.config.recompile_limit` (8) graphs of `static_step` per process, one per model shape.
    """
    param = next(model.parameters())
    decoder = _DECODERS.get(model)
    key = (batch_size, param.dtype, param.device, backend)
    if decoder is None or decoder.key != key:
        cache = KVCache.allocate(model.config, batch_size, model.config.block_size, param.device, param.dtype)
        decoder = StaticDecoder(model, cache, compile=True, backend=backend)
        decoder.key = key
        _DECODERS[model] = decoder
    return decoder
