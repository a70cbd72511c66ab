"""A callback for the DDP test: each rank writes its final weights and how many samples it generated."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from training import SampleGenerations


class RankDump(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_end(self, trainer, pl_module) -> None:
        samples = next(c for c in trainer.callbacks if isinstance(c, SampleGenerations))
        state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        record = {"state": state, "sample_rows": len(samples.rows), "world_size": trainer.world_size}
        torch.save(record, self.out_dir / f"rank{trainer.global_rank}.pt")
