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

from data.batches import IGNORE_INDEX

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
    mask=None,
) -> dict[str, float]:
    """Total nats over every token of `tokens` (an array, or what np.asarray reads: the token cache's parts) but
    the first: per token, per character, per byte. With `mask` (chat: 1 on the assistant's tokens, aligned with
    `tokens`) only the masked tokens count, as targets and as characters.

    `batch_size` windows per forward; None: as many as `windows_per_batch` allows. `progress(done, total)`
    is called after each forward with the windows scored so far.
    """
    device = next(model.parameters()).device
    batch_size = batch_size or windows_per_batch(block_size, model.config.vocab_size)
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    keep = torch.ones(len(ids), dtype=torch.bool) if mask is None else torch.from_numpy(np.asarray(mask) != 0)
    targets = ids.masked_fill(~keep, IGNORE_INDEX)
    full = (len(ids) - 1) // block_size
    x = ids[: full * block_size].view(full, block_size)
    y = targets[1 : full * block_size + 1].view(full, block_size)
    nats = 0.0
    for start in range(0, full, batch_size):
        logits = model(x[start : start + batch_size].to(device)).flatten(0, 1).float()
        target = y[start : start + batch_size].flatten().to(device)
        nats += F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum").item()
        if progress is not None:
            progress(min(start + batch_size, full), full)
    tail = ids[full * block_size :].to(device)
    if len(tail) > 1:
        tail_targets = targets[full * block_size + 1 :].to(device)
        nats += F.cross_entropy(
            model(tail[None, :-1])[0].float(), tail_targets, ignore_index=IGNORE_INDEX, reduction="sum"
        ).item()
    count = int(keep[1:].sum())
    text = tokenizer.decode(ids[1:][keep[1:]].tolist())
    return {
        "nats_per_token": nats / max(1, count),
        "nats_per_char": nats / max(1, len(text)),
        "bpb": nats / math.log(2) / max(1, len(text.encode("utf-8"))),
        "chars": len(text),
        "tokens": count,
    }
