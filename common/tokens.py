"""The special token that the tokenizer (data/) and the exports (model/) must agree on."""

from __future__ import annotations

import json

EOS_TOKEN = "<|endoftext|>"
"""Document separator and stop token: placed between documents in training, ends generation."""


def added_tokens(tokenizer_json: str) -> dict[str, dict]:
    """The added (special) tokens of a `tokenizers` JSON by their text: its documented `added_tokens` list."""
    return {token["content"]: token for token in json.loads(tokenizer_json).get("added_tokens", [])}
