"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for Lightning's ModelParallelStrategy.

Select it in a config with
    trainer:
      strategy:
        class_path: lightning.pytorch.strategies.ModelParallelStrategy
        init_args: {data_parallel_size: <world size>, tensor_parallel_size: 1}
Each block is sharded on its own (its weights are gathered just before it runs and freed after), then the
root takes the embedding, final norm and head. Lightning's `fsdp` strategy (FSDP1) refuses CPU accelerators,
so this is the sharded path the CPU tests can prove; see README "On a GPU / cluster".
"""

from __future__ import annotations

from torch import nn

from common.errors import UserError


def is_sharded(module: nn.Module) -> bool:
    """True when the module's parameters are DTensor shards, so a forward pass needs every rank."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def shard_model(model: nn.Module, device_mesh) -> None:
    """Apply fully_shard to each block and then the whole GPT, over the mesh's data-parallel dimension."""
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


def runs_on_this_rank(trainer, module: nn.Module) -> bool:
    """Rank-0 work that runs the model (samples, attention maps) must run on every rank of a sharded model,
    or rank 0 waits forever for the others to join the weight all-gather."""
    return trainer.is_global_zero or is_sharded(module)
