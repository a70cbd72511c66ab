"""Lightning training for the GPT in `model/`: the LightningModule, schedules, callbacks and the CLI."""

from checkpoints.save_on_stop import LastCheckpoint
from training.attention_maps import AttentionMaps
from training.flops import ThroughputMonitor
from training.lit_gpt import LitGPT, NonFiniteLossError
from training.samples import SampleGenerations

__all__ = [
    "AttentionMaps",
    "LastCheckpoint",
    "LitGPT",
    "NonFiniteLossError",
    "SampleGenerations",
    "ThroughputMonitor",
]
