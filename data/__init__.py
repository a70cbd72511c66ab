"""Data, by stage: source -> tokenize_parts -> store (the token cache) or stream -> batches, joined by
datamodule.py's `TextDataModule`. Importing the package loads only the standard library and `tokenizers`
(`generate.py` needs just `Tokenizer`).
"""

from common.errors import UserError
from data.tokenizer import EOS_TOKEN, Tokenizer


class DataConfigError(UserError):
    """A data setting the user can fix: one line naming the `data.*` key (or the file) and what to change."""


__all__ = ["EOS_TOKEN", "DataConfigError", "Tokenizer"]
