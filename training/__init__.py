"""Lightning training for the GPT in `model/`: the LightningModule, schedules, callbacks and the CLI.

Names are resolved lazily so that light modules such as `training.attention_image` can be imported
(by generate.py) without importing Lightning or wandb.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LitGPT": "training.lit_gpt",
    "NonFiniteLossError": "training.lit_gpt",
    "ThroughputMonitor": "training.throughput",
    "SampleGenerations": "training.samples",
    "LastCheckpoint": "training.last_checkpoint",
    "AttentionMaps": "training.attention_maps",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
