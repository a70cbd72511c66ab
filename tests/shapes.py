"""The model shapes the tests share, read from the recipe that defines each (configs/), as benchmarks/ reads them."""

from __future__ import annotations

from pathlib import Path

import yaml

from model import ModelConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def recipe_shape(name: str) -> ModelConfig:
    """The ModelConfig of configs/<name>.yaml: its model shape keys and its data's vocabulary and context."""
    recipe = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    model, data = recipe["model"], recipe["data"]
    shape = {key: model[key] for key in ("n_layer", "n_head", "n_kv_head", "n_embd")}
    return ModelConfig(vocab_size=data["vocab_size"], block_size=data["block_size"], **shape)


GPT2_SMALL = recipe_shape("gpt2-small")  # 124 M: 12 layers, 768 wide, 12 query heads sharing 4 kv heads
