"""The score a run is compared by: nats per character (and bits per byte) over the whole validation text.

`val/loss` during training is nats per token over `trainer.limit_val_batches` random windows; it cannot be
compared across tokenizers or with a character-level model. Here every validation token after the first is
scored with non-overlapping windows of block_size (the last one shorter); nats per character = total nats /
the characters those tokens decode to.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

# float32 logits held at once: windows x block_size x vocabulary x 4 bytes. A fixed 64 windows of gpt2-small
# (1024 x 50304) would be 13 GB, twice that with the softmax, at the end of a long run.
LOGITS_BUDGET_BYTES = 256 * 2**20


def windows_per_batch(block_size: int, vocab_size: int) -> int:
    """How many windows of logits fit LOGITS_BUDGET_BYTES (at least one)."""
    return max(1, LOGITS_BUDGET_BYTES // (block_size * vocab_size * 4))


@torch.no_grad()
def score_validation(
    model,
    tokenizer,
    tokens,
    block_size: int,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Total nats over every token of `tokens` (an array, or what np.asarray reads: the token cache's parts) but
    the first: per token, per character, per byte.

    `batch_size` windows per forward; None: as many as `windows_per_batch` allows. `progress(done, total)`
    is called after each forward with the windows scored so far.
    """
    device = next(model.parameters()).device
    batch_size = batch_size or windows_per_batch(block_size, model.config.vocab_size)
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    full = (len(ids) - 1) // block_size
    x = ids[: full * block_size].view(full, block_size)
    y = ids[1 : full * block_size + 1].view(full, block_size)
    nats = 0.0
    for start in range(0, full, batch_size):
        logits = model(x[start : start + batch_size].to(device)).flatten(0, 1).float()
        target = y[start : start + batch_size].flatten().to(device)
        nats += F.cross_entropy(logits, target, reduction="sum").item()
        if progress is not None:
            progress(min(start + batch_size, full), full)
    tail = ids[full * block_size :].to(device)
    if len(tail) > 1:
        nats += F.cross_entropy(model(tail[None, :-1])[0].float(), tail[1:], reduction="sum").item()
    count = len(ids) - 1
    text = tokenizer.decode(ids[1:].tolist())
    return {
        "nats_per_token": nats / count,
        "nats_per_char": nats / len(text),
        "bpb": nats / math.log(2) / len(text.encode("utf-8")),
        "chars": len(text),
        "tokens": count,
    }
