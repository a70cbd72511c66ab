"""Hugging Face weights both ways (Llama, Mistral, Qwen2, Qwen3 names) and loading a model folder.

The tensor names and the folder reading are in model/hf_weights.py, the config.json side in model/hf_config.py;
this module binds them to our GPT: `load_hf_model` (the same as `GPT.from_hf`) and the export's tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig
from .gpt import GPT
from .hf_config import check_supported, hf_config_dict, model_config_from_hf, rope_theta
from .hf_weights import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, from_hf_state_dict, hf_views, tensor_shapes

__all__ = [
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "check_supported",
    "from_hf_state_dict",
    "hf_config_dict",
    "hf_tensor_shapes",
    "load_hf_model",
    "model_config_from_hf",
    "rope_theta",
    "to_hf_state_dict",
]


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face names; each tensor is a fresh contiguous copy on the CPU.

    Copies matter: safetensors refuses tensors that share storage, and the split halves of a fused
    projection would. A tied lm_head is left out, as transformers re-ties it from `tie_word_embeddings`.
    """
    return {name: view.detach().to("cpu", copy=True).contiguous() for name, view in hf_views(model).items()}


def load_hf_model(directory: str | Path) -> GPT:
    """A GPT in eval mode with the config and weights of a supported Hugging Face folder (model/hf_config.py)."""
    return GPT.from_hf(directory)


def hf_tensor_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    """Name and shape of every tensor an export of `config` holds (computed on the meta device, no memory)."""
    return tensor_shapes(GPT, config)
