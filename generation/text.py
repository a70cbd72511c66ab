"""Text in and out: the prompt's token ids (with a note when the model will make little of them), the
streamed continuation, and the samples of a batch."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

import torch

from common.errors import UserError
from data.tokenizer import Tokenizer


class TextStream:
    """Prints decoded text as tokens arrive; holds back a trailing partial UTF-8 character until the rest
    arrives, or until `finish` (generation over) prints it as the tokenizer decodes it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, token: torch.Tensor) -> None:
        if int(token[0]) in self.tokenizer.eos_ids:  # a stop token ends the text, as in the batch path
            return
        self.ids.append(int(token[0]))
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):  # else a multi-byte character split across tokens: wait for the rest
            self._print(text)

    def finish(self) -> None:
        """Print what is still held back (generation is over: no token will complete it), as decoded."""
        self._print(self.tokenizer.decode(self.ids))

    def _print(self, text: str) -> None:
        print(text[self.printed :], end="", flush=True)
        self.printed = len(text)


def not_utf8(source: str, err: UnicodeError) -> UserError:
    """One line naming `source`, text that is not UTF-8: a decoding error on its bytes, or an encoding error on
    the lone surrogates Python keeps undecodable argv (and a C locale's stdin) bytes as."""
    bad = err.object[err.start]
    byte = bad if isinstance(bad, int) else ord(bad) & 0xFF
    return UserError(
        f"{source} is not UTF-8 text (byte 0x{byte:02x} at position {err.start}); pass UTF-8 text"
    )


def utf8(text: str, source: str) -> str:
    """`text`, if a tokenizer can take it: else `not_utf8`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise not_utf8(source, err) from None
    return text


def utf8_lines(lines: Iterable[str], source: str) -> Iterator[str]:
    """The lines (of stdin), each checked by `utf8`, with an undecodable one also `not_utf8`."""
    try:
        for line in lines:
            yield utf8(line, source)
    except UnicodeDecodeError as err:
        raise not_utf8(source, err) from None


def print_samples(tokenizer: Tokenizer, rows: list[list[int]], echo: str) -> None:
    """Each continuation of a batch under its own header, cut at its first stop token."""
    for i, row in enumerate(rows):
        print(f"--- sample {i + 1} ---\n{echo}{tokenizer.decode(tokenizer.until_stop(row))}")


def encode_prompt(tokenizer: Tokenizer, prompt: str, block_size: int, device: torch.device) -> torch.Tensor:
    ids = tokenizer.prompt_ids(prompt)
    text_ids = set(ids) - {tokenizer.bos_id}
    # An ASCII prompt has no byte >= 0x80 to be unfamiliar: the table of every token's bytes is not built.
    if text_ids and not prompt.isascii() and text_ids <= unfamiliar_byte_ids(tokenizer):
        print("note: the prompt is made only of bytes the tokenizer never merged (rare or unseen in training, "
              "e.g. emoji); the model knows little about them, so expect output unrelated to the prompt",
              file=sys.stderr)  # fmt: skip
    if len(ids) > block_size:
        print(f"note: the prompt has {len(ids)} tokens; the model sees only the last {block_size}",
              file=sys.stderr)  # fmt: skip
    return torch.tensor([ids], device=device)


def unfamiliar_byte_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids of non-ASCII single-byte tokens in no longer token: BPE merges every frequent byte, so these were rare
    in its training text (a small vocabulary leaves even common ASCII letters unmerged)."""
    table = tokenizer.token_bytes()
    merged = {byte for token in table if len(token) > 1 for byte in token}
    return {
        i for i, token in enumerate(table) if len(token) == 1 and token[0] >= 0x80 and token[0] not in merged
    }
