"""The decoder-only transformer: embeddings, a stack of blocks, the final norm and the LM head."""

from __future__ import annotations

import math

import torch
from torch import nn

from .cache import Cache
from .config import ModelConfig
from .layers import Block
from .norm import RMSNorm


class GPT(nn.Module):
    """A Llama-style GPT: pre-norm RMSNorm, RoPE, SwiGLU, causal GQA attention; no biases unless `qkv_bias`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) on every weight, zero biases, unit norm gains, and init_std / sqrt(2 * n_layer)
        on the residual projections.

        Each block adds two branches to the residual stream; shrinking the projections that write into it
        keeps the stream's variance roughly independent of depth at initialisation (GPT-2's scheme).
        """
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.down):
                nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def forward(
        self, idx: torch.Tensor, cache: Cache | None = None, *, last_only: bool = False
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T) placed after the tokens the cache holds.

        `last_only=True` returns the last position's logits only, (B, 1, V): a prefill that just picks the
        next token skips the LM head on every other position (a quarter of a 512-token prefill at V=32000).
        The cache is a `KVCache` or the static-shape cache of the compiled decode step
        (model/static_decode.py): either one hands the blocks the RoPE rows and the mask of its position.
        """
        return self._forward(idx, cache, None, last_only)

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> torch.Tensor:
        """Softmax probabilities (L, B, H, T, T) of every layer and head, from the explicit path.

        Call it in eval mode if dropout is on; it never touches a cache.
        """
        probs: list[torch.Tensor] = []
        self._forward(idx, None, probs, last_only=True)
        return torch.stack(probs)

    def _forward(
        self,
        idx: torch.Tensor,
        cache: Cache | None,
        probs_out: list[torch.Tensor] | None,
        last_only: bool,
    ) -> torch.Tensor:
        """The one walk through the blocks; `probs_out` switches attention to the explicit path."""
        t = idx.shape[1]
        if cache is None:
            if t > self.config.block_size:
                raise ValueError(
                    f"sequence of {t} tokens exceeds block_size {self.config.block_size}; "
                    "crop the input or use generate(), which slides the context"
                )
            cos, sin = self.config.rope.tables(0, t, idx.device)  # (T, D)
        else:
            cos, sin = cache.rope_rows(t)  # (T, D) at the cache's position
        x = self.dropout(self.wte(idx))  # (B, T, C)
        for block in self.blocks:
            x = block(x, cos, sin, cache, probs_out)
        if cache is not None:
            cache.advance(t)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))  # (B, T, V), or (B, 1, V) with last_only

    @torch.no_grad()
    def first_non_finite(self, idx: torch.Tensor) -> str | None:
        """The name of the first module (embedding, block, final norm, head) whose output on idx (B, T) holds a
        NaN or an infinity, or None. A full forward with hooks: for after a failure, not for every step."""
        finite: dict[str, torch.Tensor] = {}  # filled in the order the forward runs the modules
        blocks = {f"blocks.{i}": block for i, block in enumerate(self.blocks)}
        modules = {"wte": self.wte, **blocks, "norm": self.norm, "lm_head": self.lm_head}

        def record(name: str):
            def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:  # None: the output stays
                finite.setdefault(name, out.isfinite().all())

            return hook

        hooks = [module.register_forward_hook(record(name)) for name, module in modules.items()]
        try:
            self(idx[:, -self.config.block_size :])
        finally:
            for hook in hooks:
                hook.remove()
        return next((name for name, ok in finite.items() if not ok), None)

    def num_params(self, include_embedding: bool = True) -> int:
        """Parameter count, a tied embedding counted once."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_embedding else n - self.wte.weight.numel()
