"""A callback for the 2-process tests: each rank writes its losses, batches read and the full weights."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch


class StepDump(L.Callback):
    """Records {global step: loss} and {global step: input batch} per rank; writes them with the final full
    state dict (gathered from the shards on every rank under FSDP) to `<out_dir>/rank<r>.pt`."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.losses: dict[int, float] = {}
        self.batches: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])
        self.batches[trainer.global_step] = batch[0].detach().cpu().clone()

    def on_train_end(self, trainer, pl_module) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.tensor import DTensor

        if hasattr(pl_module.model, "reshard"):  # FSDP2 keeps the root gathered after a forward (the samples)
            pl_module.model.reshard()
        params = list(pl_module.model.parameters())
        # A collective under FSDP: every rank gathers the full tensors.
        state = get_model_state_dict(pl_module.model, options=StateDictOptions(full_state_dict=True))
        record = {
            "sharded": bool(params) and all(isinstance(p, DTensor) for p in params),
            "local_numel": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params),
            "full_numel": sum(p.numel() for p in params),  # a DTensor's numel is its global size
            "losses": self.losses,
            "batches": self.batches,
            "world_size": trainer.world_size,
            "state": {k: v.detach().cpu().clone() for k, v in state.items()},
            "strategy": type(trainer.strategy).__name__,
        }
        torch.save(record, self.out_dir / f"rank{trainer.global_rank}.pt")
