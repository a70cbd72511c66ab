"""The one table of tensor names: ours <-> Hugging Face <-> llama.cpp (GGUF), read in both directions.

Each row is one tensor of our state_dict (`{i}` is the block index) and the tensors other formats store for it:
one, or several stacked by rows into our fused layers (q/k/v and their Qwen2 biases, gate/up).

RoPE layout: ours is rotate-half, pairing dimension j of a head with j + D/2; llama.cpp's `llama` rotates
adjacent pairs (2j, 2j + 1) with the same frequencies, so moving row j + D/2 next to row j in every q and k head
(the `rope` parts) computes the same attention. llama.cpp's `qwen2` and `qwen3` rotate halves as we do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from model.config import ModelConfig

from .source import PretrainedError

Format = Literal["hf", "gguf"]
# The llama.cpp architectures whose q/k rows are adjacent RoPE pairs (the `rope` parts permuted).
INTERLEAVED = ("llama",)
T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    """One stored tensor: its Hugging Face and GGUF names, how many rows it has, whether GGUF `llama` permutes it."""

    hf: str
    gguf: str
    rows: Literal["all", "q", "kv", "mlp"] = "all"
    rope: bool = False


def _qkv(kind: str) -> tuple[Part, ...]:
    hf, gguf = f"model.layers.{{i}}.self_attn.{{}}_proj.{kind}", f"blk.{{i}}.attn_{{}}.{kind}"
    return tuple(
        Part(hf.replace("{}", p), gguf.replace("{}", p), rows, rope=p != "v")
        for p, rows in (("q", "q"), ("k", "kv"), ("v", "kv"))
    )


def _block(hf: str, gguf: str) -> tuple[Part]:
    return (Part(f"model.layers.{{i}}.{hf}", f"blk.{{i}}.{gguf}"),)


TABLE: dict[str, tuple[Part, ...]] = {
    "wte.weight": (Part("model.embed_tokens.weight", "token_embd.weight"),),
    "norm.weight": (Part("model.norm.weight", "output_norm.weight"),),
    "lm_head.weight": (Part("lm_head.weight", "output.weight"),),  # absent when tied: the embedding serves
    "blocks.{i}.attn_norm.weight": _block("input_layernorm.weight", "attn_norm.weight"),
    "blocks.{i}.attn.qkv.weight": _qkv("weight"),
    "blocks.{i}.attn.qkv.bias": _qkv("bias"),  # Qwen2
    "blocks.{i}.attn.q_norm.weight": _block("self_attn.q_norm.weight", "attn_q_norm.weight"),  # Qwen3
    "blocks.{i}.attn.k_norm.weight": _block("self_attn.k_norm.weight", "attn_k_norm.weight"),
    "blocks.{i}.attn.proj.weight": _block("self_attn.o_proj.weight", "attn_output.weight"),
    "blocks.{i}.mlp_norm.weight": _block("post_attention_layernorm.weight", "ffn_norm.weight"),
    "blocks.{i}.mlp.gate_up.weight": (
        Part("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", "mlp"),
        Part("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", "mlp"),
    ),
    "blocks.{i}.mlp.down.weight": _block("mlp.down_proj.weight", "ffn_down.weight"),
}
_BLOCK_INDEX = re.compile(r"^blocks\.(\d+)\.")


def row(name: str) -> tuple[tuple[Part, ...], str]:
    """The parts of our tensor `name` and its block index ("" outside the blocks)."""
    match = _BLOCK_INDEX.match(name)
    index = match.group(1) if match else ""
    return TABLE[_BLOCK_INDEX.sub("blocks.{i}.", name)], index


def own_tensors(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our tensors that other formats store: a tied lm_head is the embedding, so it is left out."""
    return {k: v for k, v in state.items() if not (k == "lm_head.weight" and config.tie_embeddings)}


def to_format(
    state: dict[str, torch.Tensor], config: ModelConfig, fmt: Format, interleave: bool = False
) -> dict[str, torch.Tensor]:
    """Our tensors under `fmt`'s names (views: fused layers split); `interleave` puts q/k rows in GGUF llama order."""
    heads = {"q": config.n_head, "kv": config.n_kv_head}
    sizes = {rows: n * config.head_dim for rows, n in heads.items()} | {"mlp": config.hidden_dim}
    out = {}
    for name, tensor in own_tensors(state, config).items():
        parts, i = row(name)
        pieces = [tensor] if len(parts) == 1 else tensor.split([sizes[p.rows] for p in parts])
        for part, piece in zip(parts, pieces, strict=True):
            if interleave and part.rope:
                piece = to_interleaved_rope(piece, piece.shape[0] // config.head_dim)
            out[getattr(part, fmt).format(i=i)] = piece
    return out


def from_format(
    names: Iterable[str],
    config: ModelConfig,
    fmt: Format,
    take: Callable[[str], T | None],
    join: Callable[[list[T]], T | None],
    rotate_half: Callable[[T, int], T] | None = None,
) -> dict[str, T]:
    """Our tensors `names` from `fmt`'s: `take(stored name)`, stacked parts joined by `join`, the q/k rows put
    back in rotate-half order by `rotate_half(value, heads)` when given. A name `take` answers None for is left
    out (the kept GGUF blocks skip layers stored as floats)."""
    out = {}
    for name in names:
        parts, i = row(name)
        values = [take(getattr(part, fmt).format(i=i)) for part in parts]
        if any(value is None for value in values):
            continue
        if rotate_half is not None:
            heads = {"q": config.n_head, "kv": config.n_kv_head}
            values = [
                rotate_half(v, heads[p.rows]) if p.rope else v for v, p in zip(values, parts, strict=True)
            ]
        joined = values[0] if len(values) == 1 else join(values)
        if joined is not None:  # a join may refuse (blocks of mixed types)
            out[name] = joined
    return out


def check_stored(
    stored: dict[str, tuple[int, ...]],
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    fmt: Format,
    where: str,
    tolerated: tuple[str, ...] = (),
) -> None:
    """One-line PretrainedError (prefixed `where`) for a tensor of `state` that is not stored, a stored one no
    row asks for (unless its name ends with one of `tolerated`) or a stored shape `config` does not imply."""
    expected = {n: tuple(t.shape) for n, t in to_format(state, config, fmt).items()}
    missing = sorted(expected.keys() - stored.keys())
    if missing:
        raise PretrainedError(f"{where} the weights lack tensor '{missing[0]}'; the file is incomplete")
    for name, shape in sorted(stored.items()):
        if name not in expected and not name.endswith(tolerated):
            raise PretrainedError(f"{where} unexpected tensor '{name}'; its config has no place for it")
        if name in expected and shape != expected[name]:
            raise PretrainedError(
                f"{where} tensor '{name}' has shape {shape}; its config implies {expected[name]}"
            )


def check_layer_count(stored: Iterable[str], config: ModelConfig, fmt: Format, where: str) -> None:
    """One-line PretrainedError unless the stored tensor names hold `config.n_layer` blocks: checked before a
    model is built, so a damaged layer count (10**12) is refused, not allocated."""
    prefix = getattr(TABLE["blocks.{i}.attn_norm.weight"][0], fmt).partition("{i}")[0]
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = 1 + max((int(m.group(1)) for name in stored if (m := pattern.match(name))), default=-1)
    if found != config.n_layer:
        raise PretrainedError(
            f"{where} says {config.n_layer} layers but the weights hold {found}; the file is damaged or belongs "
            "to another model"
        )


def to_interleaved_rope(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q or k rows (n_heads * D, ...) reordered from rotate-half pairs to adjacent pairs per head."""
    halves = rows.reshape(n_heads, 2, rows.shape[0] // n_heads // 2, *rows.shape[1:])  # (H, 2, D/2, ...)
    return halves.transpose(1, 2).reshape(rows.shape)  # (H * D, ...), rows j and j + D/2 now adjacent


def from_interleaved_rope(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `to_interleaved_rope`: adjacent pairs back to rotate-half rows."""
    pairs = rows.reshape(n_heads, rows.shape[0] // n_heads // 2, 2, *rows.shape[1:])  # (H, D/2, 2, ...)
    return pairs.transpose(1, 2).reshape(rows.shape)  # (H * D, ...)
