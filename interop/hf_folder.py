"""A Hugging Face model folder: config.json <-> our ModelConfig, safetensors weights <-> our GPT.

What is supported is in docs/architectures.md; anything else is refused in one line that names the config.json
key, its value and what is supported. Our RoPE is Hugging Face's rotate-half, so q/k rows map over unpermuted.
"""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import torch

from common.errors import UserError
from model.config import ModelConfig
from model.gpt import GPT

from .model_files import ModelFileError, check_types, read_json_object
from .names import check_layer_count, check_stored, from_format, to_format
from .safetensors_file import hf_weight_files
from .source import PretrainedError

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# Llama 3's RoPE scaling: config.json's keys and our ModelConfig fields, read and written with this one map.
LLAMA3 = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
          "high_freq_factor": "rope_high_freq_factor", "original_max_position_embeddings": "rope_original_context"}  # fmt: skip
REQUIRED = ("vocab_size", "max_position_embeddings", "num_hidden_layers", "num_attention_heads", "hidden_size",
            "intermediate_size")  # fmt: skip
# The type of every config.json key we read; a key outside REQUIRED may be absent, and null only if NULLABLE.
TYPES = (
    dict.fromkeys((*REQUIRED, "num_key_value_heads", "head_dim"), int)
    | dict.fromkeys(("rope_theta", "rms_norm_eps", "initializer_range"), float)
    | dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"), bool)
    | dict.fromkeys(("model_type", "hidden_act"), str)
    | dict.fromkeys(("architectures", "layer_types"), list)
)
NULLABLE = ("num_key_value_heads", "head_dim", "architectures", "layer_types")


def model_config_from_hf(hf: dict, source: str) -> ModelConfig:
    """Our ModelConfig for a supported config.json (`source` names it in errors); one line for anything else."""
    check_supported(hf, source)
    model_type = hf["model_type"]
    rope = rope_parameters(hf)
    check_types(rope, source, {"rope_theta": float})  # null is no default: the key is there
    llama3 = rope.get("rope_type", rope.get("type")) == "llama3"
    fields = dict(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        n_embd=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        mlp_hidden=hf["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        # Every one of these config classes defaults to untied, so a config without the key is untied.
        tie_embeddings=hf.get("tie_word_embeddings", False),
        init_std=float(hf.get("initializer_range", 0.02)),
        qkv_bias=model_type == "qwen2",  # Qwen2 always biases q, k and v (and never o)
        qk_norm=model_type == "qwen3",
        rope_type="llama3" if llama3 else "default",
    )
    if llama3:
        fields |= {
            ours: (int if ours == "rope_original_context" else float)(rope[key])
            for key, ours in LLAMA3.items()
        }
    try:
        return ModelConfig(**fields)
    except ValueError as err:  # ModelConfig's own check of the values
        raise ModelFileError(f"{source}: {err}") from err


def check_supported(hf: dict, source: str) -> None:
    """Raise a one-line UserError naming `source` and the first key that asks for something we lack."""
    supported = ", ".join(f"{name} ({arch})" for name, arch in ARCHITECTURES.items())
    if "model_type" not in hf:
        raise ModelFileError(f"{source} lacks 'model_type'; supported are {supported}")
    check_types(hf, source, TYPES, NULLABLE)
    model_type = hf["model_type"]
    if model_type not in ARCHITECTURES:
        raise ModelFileError(
            f"{source}: unsupported field model_type={model_type!r}: supported are {supported}"
        )
    architectures = hf.get("architectures") or [ARCHITECTURES[model_type]]
    if architectures != [ARCHITECTURES[model_type]]:
        raise ModelFileError(
            f"{source}: unsupported field architectures={architectures!r}: a {model_type} model must be "
            f"[{ARCHITECTURES[model_type]!r}]"
        )
    for field in REQUIRED:
        if field not in hf:
            raise ModelFileError(
                f"{source} lacks '{field}'; it is required for a {ARCHITECTURES[model_type]}"
            )
    # (config.json key, supported?, what is supported) for every feature outside our block
    head_dim = hf.get("head_dim")  # an integer or null (check_types)
    # Qwen reads the window size only when use_sliding_window is on.
    no_window = "use_sliding_window" in hf or hf.get("sliding_window") is None
    full_layers = all(kind == "full_attention" for kind in hf.get("layer_types") or [])
    rope = "only default or complete llama3 RoPE"
    checks = [
        # Llama's and Qwen3's attention_bias also biases o_proj, which our block has no place for.
        ("attention_bias", not hf.get("attention_bias"), "only unbiased attention (Qwen2's q/k/v biases)"),
        ("mlp_bias", not hf.get("mlp_bias", False), "MLP biases are not supported"),
        ("hidden_act", hf.get("hidden_act", "silu") == "silu", "only 'silu' (SwiGLU) is supported"),
        ("use_sliding_window", not hf.get("use_sliding_window", False), "only full attention (false)"),
        ("sliding_window", no_window, "sliding windows are not supported, only null"),
        ("layer_types", full_layers, "only 'full_attention' layers are supported"),
        ("rope_scaling", _is_supported_rope(hf.get("rope_scaling")), rope),
        ("rope_parameters", _is_supported_rope(hf.get("rope_parameters")), rope),
        ("head_dim", head_dim is None or (head_dim > 0 and head_dim % 2 == 0), "it must be positive, even"),
    ]
    for field, ok, why in checks:
        if not ok:
            raise ModelFileError(f"{source}: unsupported field {field}={hf.get(field)!r}: {why}")


def _is_supported_rope(params: dict | None) -> bool:
    if params is None:
        return True
    if not isinstance(params, dict):
        return False
    kind = params.get("rope_type", params.get("type", "default"))
    # Per-layer-type RoPE would show up as nested dicts; partial rotary would rotate fewer dimensions.
    nested = any(isinstance(value, dict) for value in params.values())
    if nested or params.get("partial_rotary_factor", 1.0) != 1.0:
        return False
    if kind == "llama3":
        return all(isinstance(params.get(key), (int, float)) for key in LLAMA3)
    return kind == "default"


def rope_parameters(hf: dict) -> dict:
    """The RoPE settings: `rope_parameters` (transformers 5) or `rope_scaling` with `rope_theta` (older)."""
    if hf.get("rope_parameters"):
        return {"rope_theta": hf.get("rope_theta", 10000.0)} | hf["rope_parameters"]
    return (hf.get("rope_scaling") or {}) | {"rope_theta": hf.get("rope_theta", 10000.0)}


def hf_model_type(config: ModelConfig) -> str:
    """The Hugging Face architecture our options map onto exactly: qwen3, qwen2 or llama."""
    if config.qk_norm and config.qkv_bias:
        raise UserError(
            "model.qkv_bias together with model.qk_norm has no Hugging Face architecture "
            "(Qwen3's attention_bias also biases o_proj); export one of them"
        )
    return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"


def hf_config_dict(config: ModelConfig, dtype: torch.dtype, bos_id: int | None, eos_id: int | None) -> dict:
    """The config.json of the Hugging Face architecture that computes what `config` computes. RoPE is written
    twice: transformers 5 reads `rope_parameters`, 4 reads `rope_theta` and `rope_scaling` (null if unscaled)."""
    model_type = hf_model_type(config)
    dtype_name = str(dtype).removeprefix("torch.")
    rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
    if config.rope_type == "llama3":
        rope |= {key: getattr(config, ours) for key, ours in LLAMA3.items()}
    scaling = None if config.rope_type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    fields = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
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
        "rope_scaling": scaling,
        "rope_parameters": rope,
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
    if model_type == "qwen2":
        del fields["attention_bias"]  # Qwen2 has no switch: its q/k/v are always biased
    if model_type != "llama":
        del fields["mlp_bias"]
        window = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": config.n_layer}
        fields |= window | {"layer_types": ["full_attention"] * config.n_layer}
    return fields


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face names, each a contiguous CPU copy (safetensors refuses tensors sharing
    storage, as a fused projection's split halves do). A tied lm_head is left out: transformers re-ties it."""
    views = to_format(model.state_dict(), model.config, "hf")
    return {name: view.to("cpu", copy=True).contiguous() for name, view in views.items()}


def read_hf_config(directory: Path) -> ModelConfig:
    """The ModelConfig of a folder's config.json; every mistake is one line naming the file."""
    path = directory / "config.json"
    if not path.is_file():
        raise PretrainedError(f"{directory}: no config.json; pass a Hugging Face model folder")
    return model_config_from_hf(read_json_object(path), str(path))


def load_hf(directory: str | Path) -> GPT:
    """A GPT in eval mode with the config and weights of a supported Hugging Face folder (single or sharded)."""
    directory = Path(directory).expanduser()
    config = read_hf_config(directory)
    files = hf_weight_files(directory)
    check_layer_count(files, config, "hf", f"{directory}: config.json's num_hidden_layers")
    expected = empty_model(config)
    shapes = {name: file.shapes[name] for name, file in files.items()}
    # Old transformers versions saved the RoPE buffer; a tied lm_head may be stored too. Neither is read.
    tolerated = ("rotary_emb.inv_freq",) + (("lm_head.weight",) if config.tie_embeddings else ())
    check_stored(shapes, config, expected.state_dict(), "hf", f"{directory}:", tolerated)

    # One tensor at a time from the memory-mapped files: the peak is about the model's bytes, not file + model.
    def take(name: str) -> torch.Tensor | None:
        return files[name].copy(name) if name in files else None

    state = from_format(expected.state_dict(), config, "hf", take, torch.cat)
    dtype = state["wte.weight"].dtype
    return model_of(config, {name: tensor.to(dtype) for name, tensor in state.items()}).eval()


def model_of(config: ModelConfig, state: dict[str, torch.Tensor]) -> GPT:
    """Our GPT made of `state`'s tensors (a tied lm_head: the embedding's, whatever `state` holds for it)."""
    model = empty_model(config)
    assign(model, state)
    return model


def empty_model(config: ModelConfig) -> GPT:
    """Our GPT with every tensor on the meta device, to be filled from a file. Nothing is initialised:
    initialising 135 M weights only to overwrite them was a fifth of SmolLM2's load, and even on the meta device
    torch's initialisers import torch._refs (2 s of a 6 s load)."""
    untouched = {name: lambda tensor, *args, **kwargs: tensor for name in _INITIALISERS}
    with torch.device("meta"), patch.multiple(torch.nn.init, **untouched):
        return GPT(config)


# The initialisers the constructors of GPT and its torch layers call.
_INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_")


def assign(model: GPT, state: dict[str, torch.Tensor]) -> None:
    """Make `state`'s tensors the model's own (no copy), for every tensor still on the meta device; a tied
    lm_head is the embedding's, whatever `state` holds for it (some exporters write a copy)."""
    tied = model.config.tie_embeddings and isinstance(model.lm_head, torch.nn.Linear)
    if tied:
        state = state | {"lm_head.weight": state["wte.weight"]}
    own = model.state_dict()
    missing, unexpected = {n for n, t in own.items() if t.is_meta} - state.keys(), state.keys() - own.keys()
    if missing or unexpected:
        raise RuntimeError(f"tensors missing: {sorted(missing)}, unexpected: {sorted(unexpected)}")
    model.load_state_dict(state, assign=True, strict=False)
    if tied:  # assign gave the two names a parameter each; tied, they are one
        model.lm_head.weight = model.wte.weight
