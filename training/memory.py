"""How much memory a training run needs per device, counted from the config before anything is allocated.

Activations are the tensors autograd keeps for the eager model's backward with dropout 0 (checked byte for byte by
the tests); torch.compile usually keeps less, and transient buffers (logits, backward temporaries) come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from model import ModelConfig
from model.cache import cache_bytes

from .flops import matmul_params

HALF_PRECISIONS = ("bf16-mixed", "16-mixed", "bf16-true", "16-true", "bf16", "16")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device for one training configuration."""

    parameters: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    kv_cache_bytes_per_token: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


def dtype_bytes(precision: str) -> tuple[int, int]:
    """(parameter bytes, compute bytes) of a Lightning precision string ("32-true", "bf16-mixed", ...)."""
    precision = str(precision)
    if precision.startswith("64"):
        return 8, 8
    compute = 2 if precision in HALF_PRECISIONS else 4
    params = 2 if precision.endswith("-true") and compute == 2 else 4
    return params, compute


def count_parameters(config: ModelConfig) -> int:
    """All parameters, a tied embedding counted once: matmul weights, the embedding if untied, norm gains."""
    untied_embedding = 0 if config.tie_embeddings else config.vocab_size * config.n_embd
    norms = (2 * config.n_layer + 1) * config.n_embd
    return matmul_params(config) + untied_embedding + norms


def activation_bytes(config: ModelConfig, batch_size: int, seq_len: int, precision: str) -> int:
    """Bytes of activations kept for backward by one micro-batch of `batch_size` x `seq_len` tokens."""
    p, a = dtype_bytes(precision)
    c, h, hkv, d, f = config.n_embd, config.n_head, config.n_kv_head, config.head_dim, config.hidden_dim
    # Per RMSNorm: its float32 input and rstd, the normed output (p), the matmul input in the compute dtype (a).
    norm = 4 * c + 4 + p * c + a * c
    # The qkv output (v a view of it), roped q and k, the attention output (the proj input) and its logsumexp.
    attention = a * ((h + 2 * hkv) * d + (h + hkv) * d + h * d) + 4 * h
    per_layer = 2 * norm + attention + a * 4 * f  # SwiGLU: gate/up output (2F), silu(gate), the down input
    # Plus the final norm, float32 log-probabilities and the int64 inputs and targets.
    per_token = config.n_layer * per_layer + norm + 4 * config.vocab_size + 16
    # cos and sin in float32, shared by all layers; model/attention.py caches them for a power-of-two length.
    rope_tables = 2 * (1 << (seq_len - 1).bit_length()) * config.head_dim * 4
    mixed = str(precision).endswith("-mixed")
    weight_copies = a * matmul_params(config) if mixed else 0  # autocast keeps the cast weights for backward
    return batch_size * seq_len * per_token + rope_tables + weight_copies


def kv_cache_bytes_per_token(config: ModelConfig, precision: str) -> int:
    """Bytes one generated token adds to the KV cache (all layers, keys and values) in the compute dtype."""
    _, a = dtype_bytes(precision)
    return cache_bytes(config, 1, a)


def estimate_training_memory(
    config: ModelConfig,
    batch_size: int,
    seq_len: int,
    precision: str,
    shards: int = 1,
    trainable: int | None = None,
    weight_bytes: int | None = None,
) -> MemoryEstimate:
    """Per-device bytes with AdamW; `shards` divides weights, grads and optimizer state as FSDP does. With adapters
    (LoRA) only `trainable` parameters have gradients and AdamW state, and `weight_bytes` are the model's tensors
    as loaded (a kept-block base: its blocks)."""
    p, _ = dtype_bytes(precision)
    n = count_parameters(config)
    learned = n if trainable is None else trainable
    return MemoryEstimate(
        parameters=n,
        weight_bytes=(p * n if weight_bytes is None else weight_bytes) // shards,
        grad_bytes=p * learned // shards,
        optimizer_bytes=2 * p * learned // shards,  # AdamW's exp_avg and exp_avg_sq, in the parameters' dtype
        activation_bytes=activation_bytes(config, batch_size, seq_len, precision),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(config, precision),
    )
