"""A small Llama-style GPT built around causal grouped-query attention, in pure PyTorch.

Shape legend used in the comments of this package:
    B batch, T new tokens, S key length (= cache pos + T), C n_embd, H n_head, Hkv n_kv_head,
    D head_dim (= C / H), V vocab size, L n_layer.
"""

from .cache import KVCache
from .config import ModelConfig
from .gpt import GPT

__all__ = ["GPT", "KVCache", "ModelConfig"]
