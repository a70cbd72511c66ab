"""Data: byte-level BPE tokenizer, Hugging Face `datasets` loading, token cache and the LightningDataModule.

`from data import Tokenizer` (and `from data.tokenizer import Tokenizer`) import only `tokenizers`, so
`generate.py` stays light; the torch/Lightning/datasets parts load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from data.errors import DataConfigError
from data.tokenizer import EOS_TOKEN, Tokenizer

if TYPE_CHECKING:
    from data.batches import TrainBatches, ValWindows
    from data.datamodule import TextDataModule
    from data.prepare import PrepareSettings, prepare_tokens
    from data.source import CorpusSource
    from data.token_store import TokenCache, open_token_cache

_LAZY = {
    "TextDataModule": "data.datamodule",
    "TrainBatches": "data.batches",
    "ValWindows": "data.batches",
    "CorpusSource": "data.source",
    "PrepareSettings": "data.prepare",
    "prepare_tokens": "data.prepare",
    "TokenCache": "data.token_store",
    "open_token_cache": "data.token_store",
}

__all__ = [
    "EOS_TOKEN",
    "CorpusSource",
    "DataConfigError",
    "PrepareSettings",
    "TextDataModule",
    "TokenCache",
    "Tokenizer",
    "TrainBatches",
    "ValWindows",
    "open_token_cache",
    "prepare_tokens",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'data' has no attribute '{name}'")
