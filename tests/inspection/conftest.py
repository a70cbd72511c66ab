"""Explorer test helpers: a tiny GPT with sharp heads, cheap synthetic maps, reading a page's data.

Shared through the `explorer_kit` fixture (test modules cannot import each other under importlib mode).
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from model import GPT, ModelConfig


def sharp_model(n_layer: int = 2, n_head: int = 4, block_size: int = 64) -> GPT:
    """A random tiny GPT whose heads are far from uniform (large init), so each row has a clear top key.

    A default-initialised random model attends almost uniformly: every key ties and "the keys a query
    attends to most" would be any of them.
    """
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64, block_size=block_size, n_layer=n_layer, n_head=n_head, n_kv_head=n_head // 2,
        n_embd=32, init_std=0.3,
    )  # fmt: skip
    return GPT(config).eval()


def noisy_maps(n_layer: int, n_head: int, t: int, distinct: int | None = None, seed: int = 0) -> torch.Tensor:
    """(L, H, T, T) causal softmax maps of random scores, head k sharper than head k - 1.

    With `distinct`, only that many different heads are drawn and repeated: enough for timing the page,
    far cheaper to make.
    """
    g = torch.Generator().manual_seed(seed)
    count = n_layer * n_head if distinct is None else distinct
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    heads = []
    for k in range(count):
        sharpness = 0.5 + 7.5 * k / max(1, count - 1)
        scores = torch.randn(t, t, generator=g) * sharpness
        heads.append(scores.masked_fill(~mask, float("-inf")).softmax(dim=-1))
    index = torch.arange(n_layer * n_head) % count
    return torch.stack(heads)[index].reshape(n_layer, n_head, t, t)


def explorer_meta(page: str) -> dict:
    """The JSON metadata block of an explorer page."""
    body = re.search(r'<script id="explorer-meta" type="application/json">(.*?)</script>', page, re.S).group(
        1
    )
    return json.loads(body)


def top_keys_with_margin(probs: np.ndarray, k: int) -> list[int]:
    """Queries whose k-th strongest key beats the (k+1)-th by more than one quantisation step of their row.

    Only there is "the top k keys" unambiguous after uint8 quantisation (see explorer.quantise_rows).
    """
    queries = []
    for i in range(k, probs.shape[0]):
        row = np.sort(probs[i, : i + 1])[::-1]
        if row[k - 1] - row[k] > row[0] / 255:
            queries.append(i)
    return queries


def expected_top_keys(probs: np.ndarray, i: int, k: int) -> set[int]:
    """The k keys query i weights most, from the float probabilities."""
    return set(np.argsort(-probs[i, : i + 1], kind="stable")[:k].tolist())


@pytest.fixture(scope="session")
def explorer_kit() -> SimpleNamespace:
    return SimpleNamespace(
        sharp_model=sharp_model,
        noisy_maps=noisy_maps,
        meta=explorer_meta,
        top_keys_with_margin=top_keys_with_margin,
        expected_top_keys=expected_top_keys,
    )
