"""The special token the tokenizer (data/) and the exports (interop/) agree on, and the tokenizer string.

A tokenizer string (what `data.Tokenizer.to_json` returns and a checkpoint embeds) is either a plain `tokenizers`
JSON (our own BPE) or a wrapper object `{WRAPPER_KEY: {"tokenizer": <tokenizers JSON>, "rules": {...}}}` for a
pretrained tokenizer whose EOS/BOS ids and chat template are not part of the `tokenizers` format.
"""

from __future__ import annotations

import json

EOS_TOKEN = "<|endoftext|>"
"""Document separator and stop token: placed between documents in training, ends generation."""

WRAPPER_KEY = "gqa_gpt_tokenizer"
"""Top-level key of a tokenizer string that carries rules; `tokenizers` itself has no such key."""


def split_tokenizer_json(text: str) -> tuple[str, dict | None]:
    """(the `tokenizers` JSON, the rules dict or None) of a tokenizer string."""
    spec = json.loads(text)
    if isinstance(spec, dict) and WRAPPER_KEY in spec:
        inner = spec[WRAPPER_KEY]
        return json.dumps(inner["tokenizer"], ensure_ascii=False), dict(inner["rules"])
    return text, None
