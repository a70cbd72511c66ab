"""The streaming printer: decoded text as tokens arrive."""

from __future__ import annotations

import torch

from data.tokenizer import Tokenizer


class TextStream:
    """Prints decoded text as tokens arrive; holds back a trailing partial UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, token: torch.Tensor) -> None:
        if int(token[0]) in self.tokenizer.eos_ids:  # a stop token ends the text, as in the batch path
            return
        self.ids.append(int(token[0]))
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait for the rest
            return
        print(text[self.printed :], end="", flush=True)
        self.printed = len(text)


def print_samples(tokenizer: Tokenizer, rows: list[list[int]], echo: str) -> None:
    """Each continuation of a batch under its own header, cut at its first stop token."""
    for i, row in enumerate(rows):
        row = row[: next((i for i, t in enumerate(row) if t in tokenizer.eos_ids), len(row))]
        print(f"--- sample {i + 1} ---\n{echo}{tokenizer.decode(row)}")
