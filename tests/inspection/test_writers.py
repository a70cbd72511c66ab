"""generate.py's attention writers: what a cropped map says it shows, and a readable explain on a long text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.errors import UserError
from inspection.writers import EXPLAIN_TOKENS, check_layer_and_head, explain_attention, map_title


def test_a_cropped_unlabelled_map_says_what_it_shows():
    assert map_title(1, 12, 12) == "layer 1, 12 tokens"
    title = map_title(1, 64, 206)
    assert "the last 64 of 206 tokens" in title and "too many to label" in title


def test_a_layer_or_head_the_model_lacks_is_one_line():
    config = SimpleNamespace(n_layer=2, n_head=4)
    check_layer_and_head(config, None, 3)
    with pytest.raises(UserError, match=r"--layer must be in 0\.\.1"):
        check_layer_and_head(config, 5, 0)
    with pytest.raises(UserError, match=r"--head must be in 0\.\.3"):
        check_layer_and_head(config, 1, 4)


class CharTokenizer:
    """One token per character (ids are code points) for a model with a 64-token vocabulary."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 64 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_explain_on_a_long_text_keeps_the_last_tokens_and_says_so(explorer_kit, capsys):
    model = explorer_kit.sharp_model()
    explain_attention(model, CharTokenizer(), "x" * 100, layer=0, head=1)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"layer 0, head 1, the last {EXPLAIN_TOKENS} of 100 tokens (kept short so that the tables stay readable)"
    )
    table_lines = [line for section in out.split("\n\n")[1:] for line in section.splitlines()[1:]]
    assert len(table_lines) == 3 * (EXPLAIN_TOKENS + 1)
    assert max(len(line) for line in table_lines) <= 140
