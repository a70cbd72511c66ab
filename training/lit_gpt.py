"""The LightningModule: the GPT, its loss, optimizer, schedule and checkpoint metadata."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from checkpoints.format import LORA_KEY, META_KEY, check_lora_checkpoint, checkpoint_metadata
from common.errors import UserError
from common.library_internals import align_logged_step
from data.batches import IGNORE_INDEX
from interop.hf_folder import empty_model
from model import GPT, ModelConfig
from model.lora import TARGETS, LoRAConfig, add_lora, is_adapter_name

from .schedule import Schedule, adamw_param_groups, lr_multiplier, schedule_change_note

MAX_STEPS_KEY = "max_steps"  # in the checkpoint: what the schedule was laid over when it was saved


class NonFiniteLossError(UserError):
    """A NaN or infinite loss under the `raise` policy: a user error (exit 2) naming the config keys to change."""


class LitGPT(L.LightningModule):
    """Trains a `model.GPT` with cross-entropy, AdamW and a warmup schedule stepped every optimizer step.

    Args:
        learning_rate: Peak learning rate of AdamW.
        min_lr_ratio: Final learning rate as a fraction of the peak.
        weight_decay: AdamW weight decay, applied only to weights with 2 or more dimensions.
        beta1: AdamW beta1.
        beta2: AdamW beta2.
        warmup_steps: Optimizer steps of linear warmup.
        schedule: After warmup: cosine decay, wsd (warmup-stable-decay) or constant.
        decay_fraction: For wsd, the fraction of trainer.max_steps spent decaying at the end.
        nonfinite_loss: On a NaN/inf loss, raise (stop; the last checkpoint stays untouched) or skip the step.
        compile: Compile the model with torch.compile (worth it on GPU for long runs).
        init_from: Start from a pretrained model: our .ckpt / run directory, a Hugging Face folder, a Hub id or
            a .gguf file. Its architecture, vocabulary and context replace the model keys, its tokenizer
            replaces the BPE, and its weights are loaded at the start of a fresh fit (docs/finetune.md).
        init_revision: Hub revision (branch, tag or commit) of init_from.
        lora_rank: Train low-rank adapters of this rank on the frozen init_from model instead of every weight
            (LoRA); 0 trains every weight. Checkpoints then hold the adapters and name the base.
        lora_alpha: The adapters' update is scaled by lora_alpha / lora_rank.
        lora_dropout: Dropout on the adapters' input during training.
        lora_targets: Layers adapted in every block: qkv (the q/k/v projection), proj (attention output),
            gate_up and down (the MLP).
        keep_quantized: With LoRA on a .gguf init_from, keep the frozen matrices in the file's 4- to 8-bit
            blocks while training (QLoRA): memory about the file's size instead of 4 bytes a weight.
        model_config: The `model.ModelConfig` fields (n_layer, n_head, ...), declared and documented there;
            the CLI lists each as `--model.<field>`. vocab_size and block_size follow data.vocab_size and
            data.block_size.
    """

    def __init__(
        self,
        learning_rate: float = 1e-3,
        min_lr_ratio: float = 0.1,
        weight_decay: float = 0.1,
        beta1: float = 0.9,
        beta2: float = 0.95,
        warmup_steps: int = 100,
        schedule: Schedule = "cosine",
        decay_fraction: float = 0.2,
        nonfinite_loss: Literal["raise", "skip"] = "raise",
        compile: bool = False,
        init_from: str | None = None,
        init_revision: str | None = None,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.05,
        lora_targets: list[str] = list(TARGETS),  # noqa: B006 (jsonargparse shows the default; never mutated)
        keep_quantized: bool = False,
        **model_config: Any,
    ) -> None:
        super().__init__()
        # One line naming the key, before anything is written, instead of AdamW's traceback at the first step.
        for name, value, ok, expected in (
            ("learning_rate", learning_rate, learning_rate > 0, "a positive number such as 3e-3"),
            ("min_lr_ratio", min_lr_ratio, 0 <= min_lr_ratio <= 1, "in [0, 1]"),
            ("weight_decay", weight_decay, weight_decay >= 0, ">= 0"),
            ("beta1", beta1, 0 <= beta1 < 1, "in [0, 1)"),
            ("beta2", beta2, 0 <= beta2 < 1, "in [0, 1)"),
            ("warmup_steps", warmup_steps, warmup_steps >= 0, ">= 0"),
            ("decay_fraction", decay_fraction, 0 < decay_fraction <= 1, "in (0, 1]"),
        ):
            if not ok:
                raise UserError(f"model.{name} must be {expected}, got {value!r} (--model.{name})")
        self.lora = (
            LoRAConfig(lora_rank, lora_alpha, lora_dropout, tuple(lora_targets)) if lora_rank else None
        )
        if self.lora is not None and not init_from:
            raise UserError("model.lora_rank trains adapters on a pretrained model: set model.init_from too")
        if keep_quantized and self.lora is None:
            raise UserError(
                "model.keep_quantized keeps the frozen weights of LoRA in their blocks: set model.lora_rank too "
                "(full fine-tuning changes every weight)"
            )
        # With init_from, block_size (the context) and data.block_size (the window) differ: Lightning logs one.
        self.save_hyperparameters(ignore=["block_size"] if init_from else None)
        # jsonargparse follows **model_config into this call, so ModelConfig's fields become --model.<field>.
        config = ModelConfig(**model_config)
        # With adapters the init_from model itself becomes the model (configure_model): nothing to allocate now.
        self.model = empty_model(config) if self.lora is not None else GPT(config)
        if compile and self.lora is None:
            self.model.compile()  # in place, so state_dict keys stay unprefixed
        # A LoRA checkpoint holds the adapters only: Lightning loads them into the model the base was put in.
        self.strict_loading = self.lora is None
        self.base_sha256: str | None = None  # of the init_from weights, once loaded under adapters
        self.base_name: str | None = None
        self.skipped_batches = 0
        self.resumed_max_steps: int | None = None  # trainer.max_steps of the run a checkpoint was saved from
        # Cleared once the init_from weights are in, or by a resume (GPTCLI.fit), whose checkpoint replaces them
        # (not under adapters: their checkpoint holds none of the base).
        self.pretrained_pending = init_from is not None

    def resuming(self) -> None:
        """A resume's checkpoint replaces the init_from weights, unless it holds adapters only."""
        self.pretrained_pending = self.lora is not None

    def configure_model(self) -> None:
        # Before sharding: the full pretrained tensors load into the whole model, then FSDP2 splits them.
        if self.pretrained_pending:
            self.load_pretrained_weights()
        # Only ModelParallelStrategy sets a device mesh: it shards with FSDP2; the others keep the model whole.
        if self.device_mesh is not None:
            shard_model(self.model, self.device_mesh)

    def load_pretrained_weights(self) -> None:
        """Copy the init_from model's weights into the model (once; configure_model calls it on a fresh fit), or
        with adapters make it the model, frozen, with adapters added."""
        from interop import load, source_sha256

        hp = self.hparams
        keep = hp.keep_quantized
        loaded = load(
            hp.init_from, hp.init_revision, dtype=None if keep else torch.float32, keep_quantized=keep
        )
        ours, theirs = (
            replace(c, dropout=0.0, init_std=0.02) for c in (self.model.config, loaded.model.config)
        )
        if ours != theirs:
            raise UserError(
                f"model.init_from {hp.init_from}: the model keys describe another architecture than the "
                "pretrained one; train with train.py, which takes them from the model"
            )
        if self.lora is None:
            self.model.load_state_dict(loaded.model.state_dict())
        else:
            self.model = add_lora(loaded.model.train(), self.lora)
            if hp.compile:
                self.model.compile()
            self.base_sha256 = source_sha256(loaded.source)
            # Where a later process (a resume, generate.py) finds the base: a Hub id, or the absolute path.
            source = loaded.source
            self.base_name = source.name if source.kind == "hub" else str(source.path.resolve())
        self.pretrained_pending = False
        kept = " (frozen matrices kept in their blocks)" if keep else ""
        rank_zero_info(f"init_from: weights of {loaded.source}{kept}")

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy in nats per scored token: targets equal to IGNORE_INDEX (for chat, the tokens the
        assistant did not write) are skipped; a batch with none scores 0 rather than 0 / 0."""
        logits = self.model(x)
        targets = y.flatten()
        total = F.cross_entropy(
            logits.flatten(0, 1).float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return total / (targets != IGNORE_INDEX).sum().clamp(min=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        loss = self.loss(*batch)
        # Every rank takes the same decision, or DDP would hang waiting for the ranks that skipped.
        if self.trainer.strategy.reduce_boolean_decision(not torch.isfinite(loss).item(), all=False):
            return self._on_nonfinite_loss(loss)
        if self._is_logging_step():
            self.log("train/loss", loss, prog_bar=True)
            # One curve: both AdamW parameter groups follow the same schedule (LearningRateMonitor drew two).
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        align_logged_step(self.trainer)
        if self.model.config.dropout > 0 or (self.lora is not None and self.lora.dropout > 0):
            # Dropout's masks from (seed, step, batch): a resumed run draws what the straight run drew, whatever
            # else used the generator in between (each validation's DataLoader draws its seed from it).
            seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
            torch.manual_seed(hash((seed, self.trainer.global_step, batch_idx)) % 2**63)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Every run ends with a val/* figure: Lightning validates when asked to stop, so the last step validates
        # even off val_check_interval (once when on it). A run resumed at its last step relies on this.
        max_steps = self.trainer.max_steps
        if 0 < max_steps <= self.trainer.global_step:
            self.trainer.should_stop = True

    def _is_logging_step(self) -> bool:
        # self.log costs a measurable share of a small CPU step even where Lightning drops the value: log only there.
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.trainer.global_step + 1) % every == 0

    def _on_nonfinite_loss(self, loss: torch.Tensor) -> None:
        step = self.trainer.global_step
        if self.hparams.nonfinite_loss == "raise":
            raise NonFiniteLossError(
                f"non-finite loss ({loss.item()}) at step {step}; the last checkpoint is untouched. Lower "
                "model.learning_rate or set model.nonfinite_loss=skip"
            )
        # Returning None makes Lightning skip backward and the optimizer step for this batch.
        self.skipped_batches += 1
        self.log("train/skipped_steps", float(self.skipped_batches))
        return None

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self.loss(*batch)
        # Weighted by the targets scored, so the epoch's value is nats per scored token, not a mean of batches.
        scored = max(1, int((batch[1] != IGNORE_INDEX).sum()))
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=scored)
        bytes_per_token = getattr(self.trainer.datamodule, "bytes_per_token", None)
        if bytes_per_token:  # bits per byte lets runs with different tokenizers be compared
            self.log("val/bpb", loss / math.log(2) / bytes_per_token, sync_dist=True, batch_size=scored)

    def make_optimizer(self) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices only, using the fused kernel where the device has one."""
        hp = self.hparams
        # Lightning refuses gradient clipping with a fused optimizer under any mixed precision, bf16 included.
        mixed = self._trainer is not None and str(self.trainer.precision).endswith("-mixed")
        # One fused pass over all tensors instead of a loop per tensor (docs/results.md has the gain on CPU).
        fused = not mixed and all(p.device.type in ("cpu", "cuda") for p in self.parameters())
        return torch.optim.AdamW(
            adamw_param_groups(self.model, hp.weight_decay), lr=hp.learning_rate, betas=(hp.beta1, hp.beta2),
            fused=fused or None,
        )  # fmt: skip

    def _schedule_shape(self) -> tuple:
        """The schedule arguments of lr_multiplier after (step, max_steps)."""
        hp = self.hparams
        return hp.warmup_steps, hp.schedule, hp.min_lr_ratio, hp.decay_fraction

    def configure_optimizers(self):
        if self.trainer.max_steps is None or self.trainer.max_steps < 1:
            raise UserError(
                "trainer.max_steps must be set (> 0): the learning-rate schedule is laid out over it"
            )
        optimizer, shape = self.make_optimizer(), self._schedule_shape()
        # max_steps is read at every step so a time budget (benchmarks/shakespeare_budget.py) can move it.
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_multiplier(step, self.trainer.max_steps, *shape)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called before Lightning clips, so this is the raw norm: spikes here explain loss spikes.
        if not self._is_logging_step():
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:  # a skipped (non-finite) step ran no backward
            return
        self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads))

    def setup(self, stage: str) -> None:
        tokenizer = getattr(self.trainer.datamodule, "tokenizer", None)
        if tokenizer is not None and tokenizer.vocab_size > self.model.config.vocab_size:
            raise UserError(
                f"data.vocab_size ({self.model.config.vocab_size}) is smaller than the tokenizer's "
                f"{tokenizer.vocab_size} tokens; raise data.vocab_size or use another data.tokenizer_path"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        datamodule = self.trainer.datamodule
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None:
            raise UserError("checkpoints embed the tokenizer: train with data.TextDataModule (--data)")
        data = dict(getattr(datamodule, "hparams", {}))
        checkpoint[META_KEY] = checkpoint_metadata(
            self.model.config, tokenizer.to_json(), tokenizer.sha256, data, self.skipped_batches
        )
        checkpoint[MAX_STEPS_KEY] = self.trainer.max_steps
        if self.lora is not None:  # the adapters and where their base is: the base stays in its own file
            hp = self.hparams
            checkpoint["state_dict"] = {
                key: value for key, value in checkpoint["state_dict"].items() if is_adapter_name(key)
            }
            base = {"name": self.base_name, "revision": hp.init_revision, "sha256": self.base_sha256}
            lora = dataclasses.asdict(self.lora) | {"targets": list(self.lora.targets)}
            checkpoint[META_KEY][LORA_KEY] = lora | {"keep_quantized": hp.keep_quantized, "base": base}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None:
            check_lora_checkpoint(checkpoint, self.model, self.base_sha256, self.trainer.ckpt_path)
        self.pretrained_pending = False
        self.skipped_batches = checkpoint.get(META_KEY, {}).get("skipped_batches", 0)
        self.resumed_max_steps = checkpoint.get(MAX_STEPS_KEY)

    def on_train_start(self) -> None:
        trainer = self.trainer
        if self.resumed_max_steps is None or not trainer.is_global_zero:
            return
        note = schedule_change_note(
            trainer.global_step, self.resumed_max_steps, trainer.max_steps, self.hparams.learning_rate,
            *self._schedule_shape(),
        )  # fmt: skip
        if note:
            print(note, file=sys.stderr, flush=True)


def shard_model(model: torch.nn.Module, device_mesh) -> None:
    """FSDP2 under Lightning's ModelParallelStrategy: each block on its own, then the root, over the mesh's
    data-parallel dimension (Lightning's FSDP1 strategy refuses CPUs: this is the sharded path CPU tests prove)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    if isinstance(model, FSDPModule):  # Lightning calls configure_model again for validate/test
        return
    if device_mesh["tensor_parallel"].size() != 1:
        raise UserError(
            "trainer.strategy: the GPT has no tensor-parallel plan; set ModelParallelStrategy's "
            "tensor_parallel_size: 1 and data_parallel_size to the number of processes"
        )
    mesh = device_mesh["data_parallel"]
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # attention_maps runs the blocks outside forward(): the root must gather its own weights for it too.
    register_fsdp_forward_method(model, "attention_maps")
