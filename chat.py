"""`generate.py --chat`: a multi-turn conversation through the model's chat template, one KV cache throughout.

Each turn renders the whole conversation with the template and tokenizes it; the tokens already in the cache
are a prefix of it, so only the difference is prefilled. When they are not (the template re-wrote an earlier
turn, or a reply re-tokenizes differently) the cache is rolled back to the common prefix; when the
conversation no longer fits the context, its recent half is re-encoded from position 0. Both say so in one line.

Also here, shared with plain sampling: how sampling defaults follow the model (`model_sampler`), as
transformers' `generate` does, and the streaming printer (`TextStream`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from common.errors import UserError
from data.tokenizer import Tokenizer
from model.cache import KVCache
from model.sampling import Sampler

# Flags that make no sense with --chat (its turns come from stdin, one reply at a time from the cache).
CHAT_CONFLICTS = ("prompt", "prompt_file", "draft", "prompt_lookup", "benchmark", "compile", "no_cache",
                  "attention_map", "attention_html", "explain_attention")  # fmt: skip
# transformers' GenerationConfig defaults, used for the fields a model's generation_config.json leaves out.
TRANSFORMERS_SAMPLING = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "repetition_penalty": 1.0,
}


def model_sampler(sampler: Sampler, folder: Path | None, explicit: set[str]) -> Sampler:
    """`sampler` with the fields the user did not set taken from the model's generation_config.json.

    Like transformers: a model folder with that file samples only if it says `do_sample: true`, and is greedy
    otherwise. Without the file (our checkpoints, GGUF files) the command line's defaults stay, as in llama.cpp.
    """
    path = None if folder is None else Path(folder) / "generation_config.json"
    if path is None or not path.is_file():
        return sampler
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("do_sample", False):
        model = {field: config.get(field, default) for field, default in TRANSFORMERS_SAMPLING.items()}
    else:  # greedy: the filters do not matter
        model = {"temperature": 0.0}
    chosen = {field: value for field, value in model.items() if field not in explicit}
    if chosen and any(getattr(sampler, field) != value for field, value in chosen.items()):
        shown = ", ".join(f"{field}={value}" for field, value in chosen.items())
        print(
            f"note: sampling as {path} says ({shown}); pass --temperature etc. to override", file=sys.stderr
        )
    return dataclasses.replace(sampler, **chosen).check(prefix="generation_config.json ")


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


def check_chat_args(args: argparse.Namespace) -> None:
    """One line for a flag --chat cannot honour, before the model is loaded."""
    given = [f"--{flag}" for flag in CHAT_CONFLICTS if getattr(args, flag)]
    if args.num_samples != 1:
        given.append("--num_samples")
    if given:
        raise UserError(f"--chat reads its turns from stdin and decodes one reply from the KV cache; drop "
                        f"{', '.join(given)}")  # fmt: skip


def require_chat_template(tokenizer: Tokenizer, name: str) -> None:
    if tokenizer.chat_template is None:
        raise UserError(f"--chat: {name} has no chat template (tokenizer_config.json or the GGUF's "
                        "tokenizer.chat_template); drop --chat and pass --prompt")  # fmt: skip


class Conversation:
    """The messages so far and the KV cache holding the tokens of their rendered text."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, sampler: Sampler) -> None:
        require_chat_template(tokenizer, "the model")
        param = next(model.parameters())
        config = model.config
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.cache = KVCache.allocate(config, 1, config.block_size, device=param.device, dtype=param.dtype)
        self.messages: list[dict] = []
        self.offset = 0  # the conversation token at cache position 0 (moves when the context overflows)
        self.cached: list[int] = []  # the tokens in the cache, from position 0

    @torch.inference_mode()
    def reply(self, user_text: str, max_new_tokens: int, on_token: Callable[[torch.Tensor], None]) -> str:
        """Add a user turn, stream the assistant's answer token by token and return its text."""
        self.messages.append({"role": "user", "content": user_text})
        ids = self.tokenizer.encode(self.tokenizer.render_chat(self.messages), add_bos=False)
        logits = self.prefill(ids)
        stops, new = set(self.tokenizer.eos_ids), []
        seen = torch.tensor([ids], device=logits.device)
        while True:
            token = self.sampler.next_token(logits, seen if self.sampler.repetition_penalty != 1.0 else None)
            new.append(int(token[0]))
            on_token(token)
            if new[-1] in stops or len(new) == max_new_tokens:
                break
            if self.cache.pos == self.cache.max_len:
                print(f"\nnote: the reply reached the end of the {self.cache.max_len}-token context; it stops "
                      "here", file=sys.stderr)  # fmt: skip
                break
            logits = self.feed([new[-1]])
            seen = torch.cat([seen, token[:, None]], dim=1)
        text = self.tokenizer.decode([i for i in new if i not in stops])
        self.messages.append({"role": "assistant", "content": text})
        return text

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Bring the cache to the conversation `ids`, feeding only what it lacks; the next-token logits."""
        shared = common_prefix(self.cached, ids[self.offset :])
        if self.offset + shared == len(ids):  # nothing new at all: re-feed the last token for its logits
            shared -= 1
        if len(ids) - self.offset >= self.cache.max_len:  # no room to answer: keep the recent half
            self.offset, shared = len(ids) - max(1, self.cache.max_len // 2), 0
            print(f"note: the conversation no longer fits the {self.cache.max_len}-token context; re-encoding "
                  f"its last {len(ids) - self.offset} tokens", file=sys.stderr)  # fmt: skip
        elif shared < len(self.cached):
            print(f"note: the rendered conversation differs from the cached tokens after {shared} of "
                  f"{len(self.cached)}; re-encoding from there", file=sys.stderr)  # fmt: skip
        self.cache.rollback(shared)
        self.cached = self.cached[:shared]
        return self.feed(ids[self.offset + shared :])

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Run `ids` through the model after the cached tokens; the logits (1, V) of the next token."""
        device = self.cache.k.device
        logits = self.model(torch.tensor([ids], device=device), self.cache, last_only=True)[:, -1]
        self.cached.extend(ids)
        return logits


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run_chat(conversation: Conversation, turns: Iterable[str], max_new_tokens: int) -> None:
    """Answer each non-empty line of `turns` (stdin) in order, printing each reply as it is generated."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("> ", end="", file=sys.stderr, flush=True)
    for line in turns:
        if line.strip():
            conversation.reply(line.rstrip("\n"), max_new_tokens, TextStream(conversation.tokenizer))
            print(flush=True)
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
