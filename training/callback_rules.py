"""What the callbacks that run the model share (samples, attention maps, the fit summary): whether this step and
rank are theirs, eval mode around their forward, and the trainer's loggers of a kind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def runs_on_this_rank(trainer, module: torch.nn.Module) -> bool:
    """Rank-0 work that runs the model (samples, attention maps) must run on every rank of a sharded model (its
    parameters DTensor shards), or rank 0 waits forever for the others to join the weight all-gather."""
    from torch.distributed.tensor import DTensor

    return trainer.is_global_zero or any(isinstance(p, DTensor) for p in module.parameters())


def due(trainer, pl_module, every_n_steps: int) -> bool:
    """Whether a callback that runs the model every `every_n_steps` (0: never) works at this step on this rank."""
    step = trainer.global_step
    return bool(every_n_steps) and step % every_n_steps == 0 and runs_on_this_rank(trainer, pl_module)


@contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """`module` in eval mode for the block, then back in the mode it was in."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def loggers_of(trainer, kind: type) -> list:
    return [logger for logger in trainer.loggers if isinstance(logger, kind)]
