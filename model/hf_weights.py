"""Hugging Face tensor names both ways, and reading a model folder's config and tensors into our names.

Our RoPE already uses the rotate-half convention of Hugging Face Llama, so the q/k rows map over unpermuted;
only the fused projections (qkv and its Qwen2 biases, gate_up) are split on export and concatenated on import.
Nothing here imports model/gpt.py: `GPT.from_hf` builds on `read_hf_folder`, handing it the class to build,
so the network does not depend on its Hugging Face loader and the loader not on the network's module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from common.errors import UserError

from .config import ModelConfig
from .hf_config import model_config_from_hf

if TYPE_CHECKING:
    from .gpt import GPT

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Buffers that old transformers versions saved with the weights; they are recomputed, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_views(model: GPT) -> dict[str, torch.Tensor]:
    """Hugging Face names mapped to views of our parameters (the fused projections split)."""
    c = model.config
    qkv_sizes = [c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim]
    views = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.norm.weight}
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        attn = block.attn
        q, k, v = attn.qkv.weight.split(qkv_sizes, dim=0)
        gate, up = block.mlp.gate_up.weight.chunk(2, dim=0)
        views |= {
            prefix + "input_layernorm.weight": block.attn_norm.weight,
            prefix + "self_attn.q_proj.weight": q,
            prefix + "self_attn.k_proj.weight": k,
            prefix + "self_attn.v_proj.weight": v,
            prefix + "self_attn.o_proj.weight": block.attn.proj.weight,
            prefix + "post_attention_layernorm.weight": block.mlp_norm.weight,
            prefix + "mlp.gate_proj.weight": gate,
            prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": block.mlp.down.weight,
        }
        if attn.qkv.bias is not None:  # Qwen2
            for name, bias in zip("qkv", attn.qkv.bias.split(qkv_sizes), strict=True):
                views[prefix + f"self_attn.{name}_proj.bias"] = bias
        if attn.q_norm is not None and attn.k_norm is not None:  # Qwen3
            views[prefix + "self_attn.q_norm.weight"] = attn.q_norm.weight
            views[prefix + "self_attn.k_norm.weight"] = attn.k_norm.weight
    if not c.tie_embeddings:
        views["lm_head.weight"] = model.lm_head.weight
    return views


def from_hf_state_dict(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state_dict from Hugging Face tensors; a missing tensor is a one-line UserError."""

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise UserError(f"the weights lack tensor '{name}'; the folder is incomplete or another model")
        return tensors[name]

    ours = {"wte.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    for i in range(config.n_layer):
        hf, block = f"model.layers.{i}.", f"blocks.{i}."
        qkv = [take(hf + f"self_attn.{p}_proj.weight") for p in "qkv"]
        gate_up = [take(hf + f"mlp.{p}_proj.weight") for p in ("gate", "up")]
        ours |= {
            block + "attn_norm.weight": take(hf + "input_layernorm.weight"),
            block + "attn.qkv.weight": torch.cat(qkv, dim=0),
            block + "attn.proj.weight": take(hf + "self_attn.o_proj.weight"),
            block + "mlp_norm.weight": take(hf + "post_attention_layernorm.weight"),
            block + "mlp.gate_up.weight": torch.cat(gate_up, dim=0),
            block + "mlp.down.weight": take(hf + "mlp.down_proj.weight"),
        }
        if config.qkv_bias:
            ours[block + "attn.qkv.bias"] = torch.cat([take(hf + f"self_attn.{p}_proj.bias") for p in "qkv"])
        if config.qk_norm:
            ours[block + "attn.q_norm.weight"] = take(hf + "self_attn.q_norm.weight")
            ours[block + "attn.k_norm.weight"] = take(hf + "self_attn.k_norm.weight")
    # A tied lm_head is the embedding itself; a stored copy (some exporters write one) is ignored, as in
    # transformers.
    ours["lm_head.weight"] = ours["wte.weight"] if config.tie_embeddings else take("lm_head.weight")
    return ours


def load_hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    index_path = directory / WEIGHTS_INDEX_NAME
    if index_path.is_file():
        shards = sorted(set(json.loads(index_path.read_text()).get("weight_map", {}).values()))
    elif (directory / WEIGHTS_NAME).is_file():
        shards = [WEIGHTS_NAME]
    else:
        raise UserError(f"no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; save the weights as safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            tensors |= load_file(directory / shard)
        except Exception as err:  # safetensors raises its own error type for truncated or foreign files
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot read {shard} ({reason}); the file is missing or damaged") from err
    return tensors


def read_hf_folder(
    directory: str | Path, model_class: type[GPT]
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and our state_dict of a supported Hugging Face folder, checked against `model_class`'s shapes."""
    directory = Path(directory).expanduser()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise UserError(f"{directory}: no config.json; pass a Hugging Face model folder")
    try:
        config = model_config_from_hf(json.loads(config_path.read_text()))
        tensors = load_hf_tensors(directory)
        check_tensors(tensors, config, tensor_shapes(model_class, config))
    except ValueError as err:  # UserError, or ModelConfig's own check of the values
        raise UserError(f"{directory}: {err}") from err
    return config, from_hf_state_dict(tensors, config)


def tensor_shapes(model_class: type[GPT], config: ModelConfig) -> dict[str, torch.Size]:
    """Name and shape of every tensor an export of `config` holds (computed on the meta device, no memory)."""
    with torch.device("meta"):
        return {name: view.shape for name, view in hf_views(model_class(config)).items()}


def check_tensors(
    tensors: dict[str, torch.Tensor], config: ModelConfig, expected: dict[str, torch.Size]
) -> None:
    """One-line UserError for a missing, unexpected or misshapen tensor.

    Unexpected weights (biases, extra layers) would be silently dropped, so they mean a model we cannot run.
    """
    missing = sorted(expected.keys() - tensors.keys())
    if missing:
        raise UserError(f"the weights lack tensor '{missing[0]}'; the folder is incomplete or another model")
    for name, tensor in sorted(tensors.items()):
        tolerated = name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_embeddings)
        if name not in expected and not tolerated:
            raise UserError(f"unexpected tensor '{name}'; config.json describes a model without it")
        if name in expected and tensor.shape != expected[name]:
            shapes = f"{tuple(tensor.shape)}, config.json implies {tuple(expected[name])}"
            raise UserError(f"tensor '{name}' has shape {shapes}")
