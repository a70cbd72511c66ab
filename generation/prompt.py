"""The prompt's token ids, with a note when the model will make little of them."""

from __future__ import annotations

import sys

import torch

from data.tokenizer import Tokenizer


def encode_prompt(tokenizer: Tokenizer, prompt: str, block_size: int, device: torch.device) -> torch.Tensor:
    # BOS first if the model's rule says so; an empty prompt without one starts from the end-of-text token,
    # the separator every training document follows.
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    text_ids = set(ids) - {tokenizer.bos_id}
    if text_ids and text_ids <= unfamiliar_byte_ids(tokenizer):
        print("note: the prompt is made only of bytes the tokenizer never merged (rare or unseen in training, "
              "e.g. emoji); the model knows little about them, so expect output unrelated to the prompt",
              file=sys.stderr)  # fmt: skip
    if len(ids) > block_size:
        print(f"note: the prompt has {len(ids)} tokens; the model sees only the last {block_size}",
              file=sys.stderr)  # fmt: skip
    return torch.tensor([ids], device=device)


def unfamiliar_byte_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids of non-ASCII single-byte tokens that are part of no longer token: BPE merges every byte frequent in
    its training text, so one left unmerged was rare there (ASCII is excluded: a small vocabulary leaves even
    common letters unmerged)."""
    table = tokenizer.token_bytes()
    merged = {byte for token in table if len(token) > 1 for byte in token}
    return {
        i for i, token in enumerate(table) if len(token) == 1 and token[0] >= 0x80 and token[0] not in merged
    }
