"""The special token the tokenizer (data/) and the exports (interop/) agree on, and the tokenizer string: a plain
`tokenizers` JSON (our own BPE) or `{WRAPPER_KEY: {"tokenizer": <that JSON>, "rules": {...}}}` for a pretrained
tokenizer whose EOS/BOS ids and chat template the `tokenizers` format lacks.
"""

from __future__ import annotations

import json

EOS_TOKEN = "<|endoftext|>"  # placed between documents in training; ends generation
WRAPPER_KEY = "gqa_gpt_tokenizer"  # a key `tokenizers` itself never uses


def split_tokenizer_json(text: str) -> tuple[str, dict | None]:
    """(the `tokenizers` JSON, the rules dict or None) of a tokenizer string."""
    spec = json.loads(text)
    if isinstance(spec, dict) and WRAPPER_KEY in spec:
        inner = spec[WRAPPER_KEY]
        return json.dumps(inner["tokenizer"], ensure_ascii=False), dict(inner["rules"])
    return text, None
