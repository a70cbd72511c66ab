"""Conversations (`data.chat_column`): each row's `messages` rendered with the model's chat template, tokenized,
with a mask that marks the assistant's tokens, the only targets the loss counts.

A conversation is a list of {"role": "system" | "user" | "assistant", "content": str} dicts (the Hugging Face /
TRL chat format). The assistant's spans are found by rendering growing prefixes, so any template works: turn i
starts where the rendering of messages[:i] with the generation prompt ends, and ends where the rendering of
messages[:i + 1] ends; whatever the template closes the turn with (`<|im_end|>`, `</s>`) falls inside the span,
so the model learns to stop. The whole text is tokenized once and a token is the assistant's when its first
character lies in a span (tokenizing the pieces separately would differ at their seams for sentencepiece-style
tokenizers, which put a space marker in front of each call's text).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.errors import UserError
from data import DataConfigError
from data.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant")
FIX = "fix or drop that row"


def conversation_sizes(rows: Sequence[object]) -> np.ndarray:
    """UTF-8 bytes of each conversation's contents: the planning and progress measure of the tokenize stage."""
    return np.array(
        [sum(len(str(m.get("content") or "").encode("utf-8")) for m in row or [] if isinstance(m, dict))
         for row in rows],
        dtype=np.int64,
    )  # fmt: skip


def encode_conversation(tokenizer: Tokenizer, messages: object, where: str) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation: mask[k] is 1 where ids[k] is the assistant's. `where` names the row."""
    messages = _checked(messages, where)
    try:
        text, spans = _render_with_spans(tokenizer, messages, where)
    except DataConfigError:
        raise
    except UserError as error:  # the template refused these messages
        raise DataConfigError(f"{where}: {error}; {FIX}") from None
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask = [int(any(start <= first < stop for start, stop in spans)) for first, _ in offsets]
    if not any(mask):
        raise DataConfigError(f"{where}: the assistant's turns render as no tokens; {FIX}")
    return ids, mask


def _checked(messages: object, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise DataConfigError(
            f"{where}: a conversation is a non-empty list of messages, got {messages!r:.60}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataConfigError(
                f"{where}: message {i} needs a string 'content', got {message!r:.60}; {FIX}"
            )
        if message.get("role") not in ROLES:
            raise DataConfigError(
                f"{where}: message {i} has role {message.get('role')!r}; roles are {', '.join(ROLES)}; {FIX}"
            )
    if not any(message["role"] == "assistant" for message in messages):
        raise DataConfigError(f"{where}: the conversation has no assistant turn, so nothing to learn; {FIX}")
    # Only the keys the format defines: a dataset's extra columns inside messages would reach the template.
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def _render_with_spans(
    tokenizer: Tokenizer, messages: list[dict], where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    text = tokenizer.render_chat(messages, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        opened = tokenizer.render_chat(messages[:i], add_generation_prompt=True) if i else ""
        closed = tokenizer.render_chat(messages[: i + 1], add_generation_prompt=False)
        if not (closed.startswith(opened) and text.startswith(closed)):
            raise DataConfigError(
                f"{where}: the chat template does not render message {i} as a continuation of the messages "
                "before it, so the assistant's tokens cannot be found; use a model whose template does"
            )
        spans.append((len(opened), len(closed)))
    return text, spans
