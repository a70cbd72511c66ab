"""A Hugging Face model folder: config.json and safetensors weights in, our GPT out, and our weights under HF names.

Our RoPE already uses the rotate-half convention of Hugging Face Llama, so the q/k rows map over unpermuted;
only the fused projections are split on export and stacked on import (interop/names.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from common.model_files import read_json_object
from model.config import ModelConfig
from model.gpt import GPT

from .hf_config import model_config_from_hf
from .names import check_stored, from_format, to_format
from .source import PretrainedError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


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
    return model_config_from_hf(read_json_object(path), str(path))


def load_hf(directory: str | Path) -> GPT:
    """A GPT in eval mode with the config and weights of a supported Hugging Face folder (single or sharded)."""
    directory = Path(directory).expanduser()
    config = read_hf_config(directory)
    tensors = load_hf_tensors(directory)
    with torch.device("meta"):
        expected = GPT(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    # Old transformers versions saved the RoPE buffer; a tied lm_head may be stored too. Neither is read.
    tolerated = (
        ("rotary_emb.inv_freq", "lm_head.weight") if config.tie_embeddings else ("rotary_emb.inv_freq",)
    )
    check_stored(shapes, config, expected.state_dict(), "hf", f"{directory}:", tolerated)
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
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise PretrainedError(
                f"{index_path}: weight_map is not an object of file names; restore the file"
            )
        shards = sorted(set(weight_map.values()))
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
