"""generate.py --prompt_lookup / --draft: the same greedy text as plain decoding, and bad drafts refused."""

from __future__ import annotations

import pytest
import torch

from checkpoints.format import META_KEY, STATE_PREFIX, read_checkpoint
from model import GPT, ModelConfig
from tests.conftest import run_generate as run_cli


def write_draft(ckpt: str, path, vocab_delta: int = 0, drop_merge: bool = False) -> str:
    """A 1-layer draft checkpoint next to the target's, with its vocabulary or tokenizer (one merge fewer)
    changed if asked."""
    import hashlib
    import json

    raw, _ = read_checkpoint(ckpt)
    config = ModelConfig(**raw[META_KEY]["model_config"])
    draft = GPT(
        ModelConfig(**{**config.to_dict(), "n_layer": 1, "vocab_size": config.vocab_size + vocab_delta})
    )
    tokenizer_json = raw[META_KEY]["tokenizer_json"]
    if drop_merge:  # a real difference: some text tokenizes otherwise (a whitespace edit would not count)
        spec = json.loads(tokenizer_json)
        spec["model"]["merges"].pop()
        tokenizer_json = json.dumps(spec)
    meta = {
        **raw[META_KEY],
        "model_config": draft.config.to_dict(),
        "tokenizer_json": tokenizer_json,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
    }
    state = {STATE_PREFIX + key: value for key, value in draft.state_dict().items()}
    torch.save({"state_dict": state, META_KEY: meta}, path)
    return str(path)


def test_speculative_greedy_text_equals_plain_greedy(ckpt, tmp_path, capsys):
    args = [
        "--checkpoint",
        ckpt,
        "--prompt",
        "ROMEO:\nWhat say you?\nROMEO:",
        "--temperature",
        "0",
        "--max_new_tokens",
        "60",
    ]
    code, plain, _ = run_cli(capsys, *args)
    assert code == 0 and len(plain) > 1
    code, lookup, err = run_cli(capsys, *args, "--prompt_lookup")
    assert code == 0 and lookup == plain and "acceptance" in err
    code, drafted, err = run_cli(capsys, *args, "--draft", write_draft(ckpt, tmp_path / "draft.ckpt"))
    assert code == 0 and drafted == plain and "target forwards" in err


@pytest.mark.parametrize(
    ("change", "words"),
    [({"vocab_delta": 3}, "draft's vocab_size"), ({"drop_merge": True}, "different tokenizer")],
)
def test_a_draft_with_another_vocabulary_or_tokenizer_is_one_line_exit_2(
    ckpt, tmp_path, capsys, change, words
):
    draft = write_draft(ckpt, tmp_path / "other.ckpt", **change)
    code, out, err = run_cli(capsys, "--checkpoint", ckpt, "--prompt", "a", "--draft", draft)
    assert code == 2 and out == ""
    assert words in err and f"--draft {draft}" in err and err.count("\n") == 1


def test_speculative_flags_that_do_not_combine_are_refused(ckpt, capsys):
    code, _, err = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "a", "--prompt_lookup", "--num_samples", "2"
    )
    assert code == 2 and "--num_samples" in err
