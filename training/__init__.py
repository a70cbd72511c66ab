"""Lightning training for the GPT in `model/`: the LightningModule, schedules, callbacks and the CLI.

The names below load on first use, so train.py can check its arguments (training/checks.py) before Lightning's
import (seconds) is paid.
"""

from importlib import import_module

_HOMES = {
    "AttentionMaps": "training.attention_maps",
    "LastCheckpoint": "checkpoints.save_on_stop",
    "LitGPT": "training.lit_gpt",
    "NonFiniteLossError": "training.lit_gpt",
    "SampleGenerations": "training.samples",
    "ThroughputMonitor": "training.flops",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
