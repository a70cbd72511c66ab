"""Low-rank adapters (LoRA, Hu et al. 2021): a frozen layer W plus a trained update `scaling * B @ A`, with B
zero at the start, so training begins exactly at the base model and only A and B (rank r) learn.

A fused layer (q/k/v, gate/up) gets one (A, B) pair per matrix it fuses, so the adapters are the ones a model of
separate projections holds (Hugging Face's peft, llama.cpp): the part for q is `B_q @ A_q`, never mixed with k's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError

from .gpt import GPT

# Our names for the layers an adapter may go on: the module of each block they name.
TARGETS = {"qkv": "attn.qkv", "proj": "attn.proj", "gate_up": "mlp.gate_up", "down": "mlp.down"}


@dataclass(frozen=True)
class LoRAConfig:
    """Where adapters go and how big they are (the `model.lora_*` keys).

    Args:
        rank: Rank r of each adapter; 0 trains every weight instead (full fine-tuning).
        alpha: The update is scaled by alpha / rank, so a rank change keeps its size.
        dropout: Dropout on the adapters' input during training.
        targets: Layers adapted in every block: qkv, proj, gate_up, down.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    targets: tuple[str, ...] = tuple(TARGETS)

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank <= 0:
            raise UserError(f"model.lora_rank must be a positive integer (0: no adapters), got {self.rank!r}")
        if self.alpha <= 0:
            raise UserError(f"model.lora_alpha must be positive, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"model.lora_dropout must be in [0, 1), got {self.dropout!r}")
        unknown = [name for name in self.targets if name not in TARGETS]
        if unknown or not self.targets:
            raise UserError(f"model.lora_targets: {unknown or 'none given'}; pick from {', '.join(TARGETS)}")
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """`base(x) + scaling * B(A(dropout(x)))`, one (A, B) per part of a fused base; `base` (an nn.Linear or the
    kept blocks of a `QuantizedLinear`) is frozen.

    Args:
        base: The layer adapted, its weight (out, in).
        parts: The output rows of each matrix the base fuses, summing to out (one entry for an unfused layer).
        config: Rank, alpha and dropout.
    """

    def __init__(self, base: nn.Module, parts: list[int], config: LoRAConfig) -> None:
        super().__init__()
        if sum(parts) != base.out_features:
            raise ValueError(f"parts {parts} do not add up to the layer's {base.out_features} outputs")
        self.base, self.parts, self.rank, self.scaling = base, list(parts), config.rank, config.scaling
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        # A (parts * r, in): each part's A stacked; B (out, r): each part's B stacked by rows. peft's default
        # initialisation: A uniform as nn.Linear's weight is, B zero.
        like = {"device": _device(base), "dtype": _float_dtype(base)}
        self.lora_a = nn.Parameter(torch.empty(len(parts) * config.rank, base.in_features, **like))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, config.rank, **like))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = F.linear(self.dropout(x), self.lora_a)  # (..., parts * r)
        if len(self.parts) == 1:
            update = F.linear(low, self.lora_b)
        else:
            pairs = zip(low.split(self.rank, dim=-1), self.lora_b.split(self.parts), strict=True)
            update = torch.cat([F.linear(h, b) for h, b in pairs], dim=-1)
        return self.base(x) + self.scaling * update

    def delta(self) -> torch.Tensor:
        """The update the adapter adds to the base weight, (out, in)."""
        pairs = zip(self.lora_b.split(self.parts), self.lora_a.split(self.rank), strict=True)
        return self.scaling * torch.cat([b @ a for b, a in pairs])


def part_rows(model: GPT) -> dict[str, list[int]]:
    """The output rows of each matrix the target layers fuse."""
    c = model.config
    return {
        "qkv": [c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim],
        "proj": [c.n_embd],
        "gate_up": [c.hidden_dim, c.hidden_dim],
        "down": [c.n_embd],
    }


def add_lora(model: GPT, config: LoRAConfig) -> GPT:
    """Freeze every weight of `model` and put an adapter on each target layer of every block (in place)."""
    model.requires_grad_(False)
    rows = part_rows(model)
    for block in model.blocks:
        for target in config.targets:
            owner, name = _owner(block, target)
            setattr(owner, name, LoRALinear(getattr(owner, name), rows[target], config))
    return model


def adapters(model: nn.Module) -> dict[str, LoRALinear]:
    """{module name: adapter} of the adapted layers of `model`."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors, under their names in `model.state_dict()` (what a LoRA checkpoint holds)."""
    return {name: tensor for name, tensor in model.state_dict().items() if is_adapter_name(name)}


def merge_lora(model: GPT) -> GPT:
    """Fold every adapter into its base weight and drop it (in place): the plain GPT that computes the same. A
    kept-block base cannot take the update: it becomes a float nn.Linear."""
    for name, adapter in adapters(model).items():
        owner_name, _, child = name.rpartition(".")
        base = adapter.base
        weight = base.dequantize() if hasattr(base, "dequantize") else base.weight
        merged = nn.Linear(adapter.in_features, adapter.out_features, bias=base.bias is not None)
        merged = merged.to(device=weight.device, dtype=adapter.lora_a.dtype)
        with torch.no_grad():
            merged.weight.copy_(weight.float() + adapter.delta().float())
            if base.bias is not None:
                merged.bias.copy_(base.bias)
        merged.requires_grad_(False)
        setattr(model.get_submodule(owner_name), child, merged)
    return model


def _owner(block: nn.Module, target: str) -> tuple[nn.Module, str]:
    path, _, name = TARGETS[target].rpartition(".")
    return block.get_submodule(path), name


def is_adapter_name(name: str) -> bool:
    """Whether a state_dict key is an adapter's (prefixed or not)."""
    return name.endswith((".lora_a", ".lora_b"))


def _device(layer: nn.Module) -> torch.device:
    return next(iter([*layer.parameters(), *layer.buffers()])).device


def _float_dtype(layer: nn.Module) -> torch.dtype:
    weight = getattr(layer, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else torch.float32
