"""A callback for the config tests: what the Trainer and the model actually ran with, written as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from training import AttentionMaps, SampleGenerations


class RunFacts(L.Callback):
    """On rank 0 at the end of fit, write `<out_dir>/facts.json`; every rank records the autocast dtype of its
    first training forward pass (None without autocast)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.autocast_dtype: str | None = "not seen"
        self.batch_shape: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batch_shape = list(batch[0].shape)
        if self.autocast_dtype == "not seen":
            handle = pl_module.model.wte.register_forward_hook(self._record_autocast)
            self._handle = handle

    def _record_autocast(self, module, args, output) -> None:
        enabled = torch.is_autocast_enabled("cpu")
        self.autocast_dtype = str(torch.get_autocast_dtype("cpu")) if enabled else None
        self._handle.remove()

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        samples = next(c for c in trainer.callbacks if isinstance(c, SampleGenerations))
        maps = next(c for c in trainer.callbacks if isinstance(c, AttentionMaps))
        checkpoint = trainer.checkpoint_callback
        optimizer = trainer.optimizers[0]
        datamodule = trainer.datamodule
        source = datamodule.source
        facts = {
            "strategy": type(trainer.strategy).__name__,
            "precision": trainer.precision,
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "max_steps": trainer.max_steps,
            "global_step": trainer.global_step,
            "val_check_interval": trainer.val_check_interval,
            "limit_val_batches": trainer.limit_val_batches,
            "log_every_n_steps": trainer.log_every_n_steps,
            "compiled": pl_module.model._compiled_call_impl is not None,
            "autocast_dtype": self.autocast_dtype,
            "samples": {
                "every_n_steps": samples.every_n_steps,
                "prompts": samples.prompts,
                "max_new_tokens": samples.max_new_tokens,
            },
            "attention_maps": {
                "every_n_steps": maps.every_n_steps,
                "induction_period": maps.induction_period,
            },
            "checkpoint": {"every_n_train_steps": checkpoint._every_n_train_steps},
            "batches_per_rank": trainer.fit_loop.epoch_loop.batch_progress.total.completed,
            "num_workers": trainer.train_dataloader.num_workers,
            "optimizer": {
                "learning_rate": optimizer.param_groups[0]["initial_lr"],
                "weight_decay": optimizer.param_groups[0]["weight_decay"],
                "betas": list(optimizer.param_groups[0]["betas"]),
            },
            "data": {
                "dataset": source.dataset,
                "text_column": source.text_column,
                "streaming": source.streaming,
                "vocab_size": datamodule.vocab_size,
                "block_size": datamodule.block_size,
                "batch_size": datamodule.batch_size,
                "num_workers": datamodule.num_workers,
                "batch_shape": self.batch_shape,
            },
        }
        (self.out_dir / "facts.json").write_text(json.dumps(facts, indent=1), encoding="utf-8")
