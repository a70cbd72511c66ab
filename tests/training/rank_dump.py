"""A callback for the DDP test: each rank writes its final weights, its input batches and its sample count."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from training import SampleGenerations


class RankDump(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.inputs: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.inputs.append(batch[0].detach().cpu().clone())  # x (B, T) this rank trained on

    def on_train_end(self, trainer, pl_module) -> None:
        samples = next(c for c in trainer.callbacks if isinstance(c, SampleGenerations))
        state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        record = {
            "state": state,
            "sample_rows": len(samples.rows),
            "world_size": trainer.world_size,
            "inputs": self.inputs,
        }
        torch.save(record, self.out_dir / f"rank{trainer.global_rank}.pt")
