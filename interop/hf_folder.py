"""A Hugging Face model folder: config.json and safetensors weights in, our GPT out, and our weights under HF names.

Our RoPE already uses the rotate-half convention of Hugging Face Llama, so the q/k rows map over unpermuted;
only the fused projections are split on export and stacked on import (interop/names.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from common.errors import UserError
from common.model_files import read_json_object
from model.config import ModelConfig
from model.gpt import GPT

from .hf_config import model_config_from_hf
from .names import from_format, to_format
from .source import PretrainedError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Buffers that old transformers versions saved with the weights; they are recomputed, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face names; each tensor is a fresh contiguous copy on the CPU.

    Copies matter: safetensors refuses tensors that share storage, and the split halves of a fused
    projection would. A tied lm_head is left out, as transformers re-ties it from `tie_word_embeddings`.
    """
    views = to_format(model.state_dict(), model.config, "hf")
    return {name: view.to("cpu", copy=True).contiguous() for name, view in views.items()}


def read_hf_config(directory: Path) -> ModelConfig:
    """The ModelConfig of a folder's config.json; every mistake is one line naming the file."""
    path = directory / "config.json"
    if not path.is_file():
        raise PretrainedError(f"{directory}: no config.json; pass a Hugging Face model folder")
    try:
        return model_config_from_hf(read_json_object(path), str(path))
    except UserError:
        raise
    except ValueError as err:  # ModelConfig's own check of the values
        raise PretrainedError(f"{path}: {err}") from err


def load_hf(directory: str | Path) -> GPT:
    """A GPT in eval mode with the config and weights of a supported Hugging Face folder (single or sharded)."""
    directory = Path(directory).expanduser()
    config = read_hf_config(directory)
    tensors = load_hf_tensors(directory)
    with torch.device("meta"):
        expected = GPT(config)
    try:
        check_tensors(
            tensors, config, {n: t.shape for n, t in to_format(expected.state_dict(), config, "hf").items()}
        )
    except UserError as err:
        raise PretrainedError(f"{directory}: {err}") from err
    state = from_format(expected.state_dict(), config, "hf", tensors.get, torch.cat)
    if config.tie_embeddings:  # a stored copy of a tied lm_head (some exporters write one) is ignored
        state["lm_head.weight"] = state["wte.weight"]
    model = GPT(config).to(state["wte.weight"].dtype)
    model.load_state_dict(state)
    return model.eval()


def load_hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    index_path = directory / WEIGHTS_INDEX_NAME
    if index_path.is_file():
        shards = sorted(set(json.loads(index_path.read_text()).get("weight_map", {}).values()))
    elif (directory / WEIGHTS_NAME).is_file():
        shards = [WEIGHTS_NAME]
    else:
        raise PretrainedError(
            f"{directory}: no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}; save the weights as safetensors"
        )
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            tensors |= load_file(directory / shard)
        except Exception as err:  # safetensors raises its own error type for truncated or foreign files
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            raise PretrainedError(
                f"{directory / shard}: cannot read it ({reason}); the file is missing or damaged"
            ) from err
    return tensors


def check_tensors(
    tensors: dict[str, torch.Tensor], config: ModelConfig, expected: dict[str, torch.Size]
) -> None:
    """One-line UserError for a missing, unexpected or misshapen tensor.

    Unexpected weights (biases, extra layers) would be silently dropped, so they mean a model we cannot run.
    """
    missing = sorted(expected.keys() - tensors.keys())
    if missing:
        raise PretrainedError(
            f"the weights lack tensor '{missing[0]}'; the folder is incomplete or another model"
        )
    for name, tensor in sorted(tensors.items()):
        tolerated = name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_embeddings)
        if name not in expected and not tolerated:
            raise PretrainedError(f"unexpected tensor '{name}'; config.json describes a model without it")
        if name in expected and tensor.shape != expected[name]:
            shapes = f"{tuple(tensor.shape)}, config.json implies {tuple(expected[name])}"
            raise PretrainedError(f"tensor '{name}' has shape {shapes}")
