"""Fixtures the interop and generation tests share: a tiny byte-level BPE and tiny random GPTs.

The offline environment (no network, Hugging Face caches in a temporary folder) is set in tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from data.tokenizer import EOS_TOKEN, Tokenizer
from model import GPT, ModelConfig

TOKENIZER_VOCAB = 320
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "héllo",
    "wörld",
    "naïve",
    "日本語",
    "Ελληνικά",
    "🙂",
    "don't",
    "  x",
]


def running_in_ci() -> bool:
    """CI services set CI=true (.ci/run sets it too); there the hf extra is installed and must be used."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture
def transformers():
    """The transformers package. Missing locally: skip; in CI: fail, so parity is never silently untested."""
    if not running_in_ci():
        return pytest.importorskip("transformers")
    try:
        import transformers as module
    except ImportError as err:
        pytest.fail(
            f"CI=true but transformers is missing ({err}); install the hf extra: pip install -e '.[hf]'",
            pytrace=False,
        )
    return module


def training_texts() -> list[str]:
    """A deterministic multilingual corpus, repeated enough that BPE learns merges across scripts."""
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(len(WORDS), (400, 8), generator=generator).tolist()
    return [" ".join(WORDS[i] for i in row) + f" {EOS_TOKEN}" for row in picks]


@pytest.fixture(scope="session")
def tokenizer_json() -> str:
    """tokenizer.json text of a tiny byte-level BPE with `<|endoftext|>`."""
    return Tokenizer.train(training_texts(), TOKENIZER_VOCAB, show_progress=False).to_json()


@pytest.fixture(scope="session")
def encode(tokenizer: str) -> Callable[[str], list[int]]:
    """Our token ids for a text, as training and generate.py produce them."""
    return tokenizer.encode


@pytest.fixture(scope="session")
def make_model() -> Callable[..., GPT]:
    """Factory of tiny GPTs whose every weight (norms included) is random, so a swapped tensor shows."""

    def build(n_kv_head: int = 2, tie: bool = True, seed: int = 0, **overrides) -> GPT:
        torch.manual_seed(seed)
        shape = dict(
            vocab_size=TOKENIZER_VOCAB, block_size=128, n_layer=2, n_head=4, n_embd=64, mlp_hidden=96
        )
        config = ModelConfig(**(shape | overrides), n_kv_head=n_kv_head, tie_embeddings=tie, rope_theta=500.0)
        model = GPT(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                # Larger-than-init weights give peaked logits, so greedy decoding has no near-ties.
                param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3 if "norm" in name else 0.1)
        return model

    return build


@pytest.fixture(scope="session")
def tokenizer(tokenizer_json: str) -> Tokenizer:
    """The tiny byte-level BPE as our Tokenizer (what the exports take)."""
    return Tokenizer.from_json(tokenizer_json)
