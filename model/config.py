"""Model hyperparameters: one frozen dataclass, validated on construction."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from common.errors import UserError

from .attention import Llama3Scaling, Rope

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # --dtype names


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style GPT with causal grouped-query attention.

    Args:
        vocab_size: Number of token ids the embedding holds (at least the tokenizer's size).
        block_size: Longest context the model attends over; RoPE tables are built for it.
        n_layer: Number of transformer blocks.
        n_head: Number of query heads.
        n_kv_head: Number of key/value heads; n_head for MHA, 1 for MQA, a divisor of n_head for GQA.
        n_embd: Width of the residual stream.
        head_dim: Width of each attention head; None uses n_embd / n_head (Qwen3 sets it apart, e.g. 128).
        mlp_hidden: Width of the SwiGLU hidden layer; None picks 8/3 * n_embd rounded up to a multiple of 64.
        rope_theta: RoPE base frequency.
        norm_eps: Epsilon of RMSNorm.
        tie_embeddings: Share the token embedding with the output projection.
        dropout: Dropout on the residual branches during training (attention dropout stays 0 so the
            fused kernel is kept).
        init_std: Standard deviation of the normal initialisation.
        qkv_bias: Add biases to the query, key and value projections (Qwen2 / Qwen2.5).
        qk_norm: RMS-normalise each head's queries and keys before RoPE, one gain per head dimension (Qwen3).
        rope_type: "default" for plain RoPE, or "llama3" for Llama 3's rescaled low frequencies.
        rope_factor: llama3 RoPE: how much the lowest frequencies are slowed down.
        rope_low_freq_factor: llama3 RoPE: wavelengths above rope_original_context / this are fully slowed.
        rope_high_freq_factor: llama3 RoPE: wavelengths below rope_original_context / this are kept.
        rope_original_context: llama3 RoPE: the context length the model was first trained at.

    Invalid values raise a one-line `UserError` naming the field as `model.<field>`, its key in a training
    config and on the command line.
    """

    vocab_size: int = 1024
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 8
    n_kv_head: int = 2
    n_embd: int = 256
    mlp_hidden: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_type: Literal["default", "llama3"] = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192

    def __post_init__(self) -> None:
        def field(name: str, ok: bool, rule: str) -> None:
            if not ok:
                raise UserError(f"model.{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            field(name, _positive_int(getattr(self, name)), "a positive integer")
        field("mlp_hidden", self.mlp_hidden is None or self.mlp_hidden > 0, "positive or None")
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise UserError(
                    f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                    "change one of them or set model.head_dim"
                )
            # Resolved here so every reader sees an int; to_dict writes None back when it is the derived one.
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)
        field("head_dim", _positive_int(self.head_dim), "a positive integer or None")
        if self.n_head % self.n_kv_head:
            raise UserError(
                f"model.n_head ({self.n_head}) must be divisible by model.n_kv_head ({self.n_kv_head}); "
                "use n_kv_head = n_head (MHA), 1 (MQA) or another divisor (GQA)"
            )
        if self.head_dim % 2:
            raise UserError(
                f"the head dimension (model.head_dim, or model.n_embd / model.n_head) = {self.head_dim} must be "
                "even for RoPE; change model.head_dim, model.n_embd or model.n_head"
            )
        field("dropout", 0.0 <= self.dropout < 1.0, "in [0, 1)")
        for name in ("rope_theta", "norm_eps", "init_std"):
            field(name, getattr(self, name) > 0, "positive")
        field("rope_type", self.rope_type in ("default", "llama3"), "'default' or 'llama3'")
        if self.rope_type == "llama3":
            for name in ("rope_factor", "rope_low_freq_factor", "rope_original_context"):
                field(name, getattr(self, name) > 0, "positive for rope_type llama3")
            field("rope_high_freq_factor", self.rope_high_freq_factor > self.rope_low_freq_factor,
                  f"above model.rope_low_freq_factor ({self.rope_low_freq_factor}) for rope_type llama3")  # fmt: skip

    @property
    def rope(self) -> Rope:
        """The rotary embedding of these heads; caches hold it to hand each forward its cos/sin rows."""
        scaling = None
        if self.rope_type == "llama3":
            scaling = Llama3Scaling(
                float(self.rope_factor),
                float(self.rope_low_freq_factor),
                float(self.rope_high_freq_factor),
                int(self.rope_original_context),
            )
        return Rope(self.head_dim, float(self.rope_theta), scaling)

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        # Llama's rule: 2/3 of a 4x MLP keeps the parameter count of a GELU MLP; 64 keeps matmuls aligned.
        return math.ceil(8 * self.n_embd / 3 / 64) * 64

    def to_dict(self) -> dict:
        """Plain-typed fields, safe for weights_only=True checkpoints; a head_dim equal to n_embd / n_head is
        written as None, so a dict edited to a new width stays whole."""
        fields = asdict(self)
        if fields["head_dim"] == self.n_embd // self.n_head and self.n_embd % self.n_head == 0:
            fields["head_dim"] = None
        return fields


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
