"""A multi-turn conversation through the model's chat template, one KV cache throughout (docs/pretrained.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import torch

from data.tokenizer import Tokenizer
from generation.sampling import Context, Sampler, Stop, decode, naming_the_broken_layer, sample_step
from model.cache import KVCache

from .text import TextStream, utf8_lines


class Conversation:
    """The messages so far and the KV cache holding the tokens of their rendered text."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, sampler: Sampler) -> None:
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.context = Context(model, KVCache.for_model(model, 1))
        self.messages: list[dict] = []
        self.ids: list[int] = []  # the conversation's tokens so far (the cache holds its window of them)

    @torch.inference_mode()
    def reply(self, user_text: str, max_new_tokens: int, on_token: Callable[[torch.Tensor], None]) -> str:
        """Add a user turn, stream the assistant's answer and return its text; a reply cut at `max_new_tokens`
        stays in the conversation as it is (the cache holds it; the template closes the turn)."""
        self.messages.append({"role": "user", "content": user_text})
        ids = self.tokenizer.encode(self.tokenizer.render_chat(self.messages), add_bos=False)
        shared = common_prefix(self.ids, ids)
        if shared < len(self.ids):
            print(f"note: the rendered conversation differs from the cached tokens after {shared} of "
                  f"{len(self.ids)}; re-encoding from there", file=sys.stderr)  # fmt: skip
        self.context.keep(shared)
        start, size = self.context.start, self.context.block_size
        seq = torch.tensor([ids], device=self.context.cache.k.device)
        stop = Stop(self.tokenizer.eos_ids, 1, seq.device)
        with naming_the_broken_layer(self.context.model, seq):
            out = decode(seq, max_new_tokens, sample_step(self.context, self.sampler), stop, on_token)
        if self.context.start != start and self.context.start:
            print(f"\nnote: the conversation no longer fits the {size}-token context; re-encoding its last "
                  f"{out.shape[1] - self.context.start} tokens", file=sys.stderr)  # fmt: skip
        self.ids = out[0].tolist()
        new = self.ids[len(ids) :]
        if not bool(stop.done.all()):
            print(f"\nnote: the reply reached the {max_new_tokens}-token limit before the model ended its turn; "
                  "it stays in the conversation as cut", file=sys.stderr)  # fmt: skip
        text = self.tokenizer.decode([i for i in new if i not in self.tokenizer.eos_ids])
        self.messages.append({"role": "assistant", "content": text})
        return text


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def run_chat(conversation: Conversation, turns: Iterable[str], max_new_tokens: int) -> None:
    """Answer each non-empty line of `turns` (stdin), streaming the replies: on a terminal a "> " prompt (stderr)
    marks the turns; to a file or pipe each reply follows a "> " line holding the user's turn."""
    interactive, transcript = sys.stdin.isatty(), not sys.stdout.isatty()
    if interactive:
        print("> ", end="", file=sys.stderr, flush=True)
    for line in utf8_lines(turns, "a --chat turn on stdin"):
        if line.strip():
            if transcript:
                print(f"> {line.strip()}", flush=True)
            stream = TextStream(conversation.tokenizer)
            conversation.reply(line.rstrip("\n"), max_new_tokens, stream)
            stream.finish()
            print(flush=True)
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
