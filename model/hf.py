"""The Hugging Face `LlamaForCausalLM` layout: config and weight names both ways, and loading a folder.

Our RoPE already uses the rotate-half convention of Hugging Face Llama, so the q/k rows map over unpermuted;
only the fused projections (qkv, gate_up) are split on export and concatenated on import.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ModelConfig
from .gpt import GPT

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Buffers that old transformers versions saved with the weights; they are recomputed, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_config_dict(config: ModelConfig, dtype: torch.dtype, bos_id: int | None, eos_id: int | None) -> dict:
    """The config.json of a `LlamaForCausalLM` with our shapes.

    RoPE is written twice: `rope_parameters` is what transformers 5 reads, `rope_theta` with a null
    `rope_scaling` is what transformers 4 reads; each version ignores the other's keys.
    """
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.hidden_dim,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "use_cache": True,
    }


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face Llama names; each tensor is a fresh contiguous copy on the CPU.

    Copies matter: safetensors refuses tensors that share storage, and the split halves of a fused
    projection would. A tied lm_head is left out, as transformers re-ties it from `tie_word_embeddings`.
    """
    return {name: view.detach().to("cpu", copy=True).contiguous() for name, view in hf_views(model).items()}


def hf_views(model: GPT) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names mapped to views of our parameters (the fused projections split)."""
    c = model.config
    qkv_sizes = [c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim]
    views = {"model.embed_tokens.weight": model.wte.weight, "model.norm.weight": model.norm.weight}
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        q, k, v = block.attn.qkv.weight.split(qkv_sizes, dim=0)
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
    if not c.tie_embeddings:
        views["lm_head.weight"] = model.lm_head.weight
    return views


def from_hf_state_dict(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state_dict from Hugging Face Llama tensors; a missing tensor is a one-line ValueError."""

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"the weights lack tensor '{name}'; the folder is incomplete or not a Llama")
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
    # A tied lm_head is the embedding itself; a stored copy (some exporters write one) is ignored, as in
    # transformers.
    ours["lm_head.weight"] = ours["wte.weight"] if config.tie_embeddings else take("lm_head.weight")
    return ours


def model_config_from_hf(hf: dict) -> ModelConfig:
    """Our ModelConfig for a Llama config.json; a feature we do not implement is a one-line ValueError."""
    check_supported(hf)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        n_embd=hf["hidden_size"],
        mlp_hidden=hf["intermediate_size"],
        rope_theta=float(rope_theta(hf)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        # LlamaConfig's own default is untied, so a config without the key is untied.
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),
    )


def check_supported(hf: dict) -> None:
    """Raise a one-line ValueError naming the first config.json field that asks for a feature we lack."""
    required = ("vocab_size", "max_position_embeddings", "num_hidden_layers", "num_attention_heads")
    for field in (*required, "hidden_size", "intermediate_size"):
        if field not in hf:
            raise ValueError(f"config.json lacks '{field}'; it is required for a Llama model")
    checks = [
        ("model_type", hf.get("model_type", "llama") == "llama", "only 'llama' is supported"),
        ("attention_bias", not hf.get("attention_bias", False), "q/k/v/o biases are not supported"),
        ("mlp_bias", not hf.get("mlp_bias", False), "MLP biases are not supported"),
        ("hidden_act", hf.get("hidden_act", "silu") == "silu", "only 'silu' (SwiGLU) is supported"),
        ("rope_scaling", _is_default_rope(hf.get("rope_scaling")), "only unscaled RoPE is supported"),
        ("rope_parameters", _is_default_rope(hf.get("rope_parameters")), "only default RoPE is supported"),
        (
            "head_dim",
            hf.get("head_dim") in (None, hf["hidden_size"] // hf["num_attention_heads"]),
            "head_dim must equal hidden_size / num_attention_heads",
        ),
    ]
    for field, ok, why in checks:
        if not ok:
            raise ValueError(f"unsupported config.json field {field}={hf.get(field)!r}: {why}")


def _is_default_rope(params: dict | None) -> bool:
    if params is None:
        return True
    if not isinstance(params, dict):
        return False
    kind = params.get("rope_type", params.get("type", "default"))
    # Per-layer-type RoPE would show up as nested dicts; partial rotary would rotate fewer dimensions.
    nested = any(isinstance(value, dict) for value in params.values())
    return kind == "default" and not nested and params.get("partial_rotary_factor", 1.0) == 1.0


def rope_theta(hf: dict) -> float:
    """The RoPE base from `rope_parameters` (transformers 5) or `rope_theta` (older configs)."""
    params = hf.get("rope_parameters") or {}
    return params.get("rope_theta", hf.get("rope_theta", 10000.0))


def load_hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    index_path = directory / WEIGHTS_INDEX_NAME
    if index_path.is_file():
        shards = sorted(set(json.loads(index_path.read_text()).get("weight_map", {}).values()))
    elif (directory / WEIGHTS_NAME).is_file():
        shards = [WEIGHTS_NAME]
    else:
        raise ValueError(f"no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; save the weights as safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            tensors |= load_file(directory / shard)
        except Exception as err:  # safetensors raises its own error type for truncated or foreign files
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            raise ValueError(f"cannot read {shard} ({reason}); the file is missing or damaged") from err
    return tensors


def load_hf_model(directory: str | Path) -> GPT:
    """A GPT in eval mode with the config and weights of a Llama-layout Hugging Face folder."""
    directory = Path(directory).expanduser()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory}: no config.json; pass a Hugging Face model folder")
    try:
        config = model_config_from_hf(json.loads(config_path.read_text()))
        tensors = load_hf_tensors(directory)
        check_tensors(tensors, config)
    except ValueError as err:
        raise ValueError(f"{directory}: {err}") from err
    state = from_hf_state_dict(tensors, config)
    model = GPT(config).to(state["wte.weight"].dtype)
    model.load_state_dict(state)
    return model.eval()


def hf_tensor_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    """Name and shape of every tensor an export of `config` holds (computed on the meta device, no memory)."""
    with torch.device("meta"):
        return {name: view.shape for name, view in hf_views(GPT(config)).items()}


def check_tensors(tensors: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """One-line ValueError for a missing, unexpected or misshapen tensor.

    Unexpected weights (biases, extra layers) would be silently dropped, so they mean a model we cannot run.
    """
    expected = hf_tensor_shapes(config)
    missing = sorted(expected.keys() - tensors.keys())
    if missing:
        raise ValueError(f"the weights lack tensor '{missing[0]}'; the folder is incomplete or not a Llama")
    for name, tensor in sorted(tensors.items()):
        tolerated = name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_embeddings)
        if name not in expected and not tolerated:
            raise ValueError(f"unexpected tensor '{name}'; this Llama variant is not supported")
        if name in expected and tensor.shape != expected[name]:
            shapes = f"{tuple(tensor.shape)}, config.json implies {tuple(expected[name])}"
            raise ValueError(f"tensor '{name}' has shape {shapes}")
