"""The one random test model whose greedy output is varied, shared by the decoding tests of tests/model/."""

from __future__ import annotations

import torch

from model import GPT, ModelConfig


def lively_model(
    n_kv_head: int = 2,
    block_size: int = 48,
    seed: int = 0,
    *,
    vocab: int = 101,
    n_head: int = 4,
    n_embd: int = 32,
    n_layer: int = 2,
    dtype: torch.dtype = torch.float64,
) -> GPT:
    """A tiny GPT with large random weights and random norm gains, in eval mode.

    At init scale the logits are nearly flat and greedy decoding repeats the last prompt token, so two decoding
    paths would agree even when one of them ignores the cache. float64 (the default) keeps a reordered
    reduction from flipping a near-tied argmax.
    """
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab,
        block_size=block_size,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_embd=n_embd,
    )
    model = GPT(config).to(dtype).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(8) if param.dim() > 1 else param.uniform_(0.5, 2.0)
    return model
