"""Data: byte-level BPE tokenizer, Hugging Face `datasets` loading, token cache and the LightningDataModule.

This package only re-exports its light names (`Tokenizer`, `EOS_TOKEN`, `DataConfigError`: the standard
library and `tokenizers`), so `generate.py` can load a tokenizer without importing torch, `datasets` or
Lightning. Import the heavier parts from their modules: `data.datamodule.TextDataModule`,
`data.batches.TrainBatches`, `data.cache.prepare_tokens`, `data.token_store.open_token_cache`.
"""

from data.errors import DataConfigError
from data.tokenizer import EOS_TOKEN, Tokenizer

__all__ = ["EOS_TOKEN", "DataConfigError", "Tokenizer"]
