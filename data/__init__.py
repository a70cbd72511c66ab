"""Data, by stage: source -> tokenize -> store (the token cache) or stream -> batches, joined by the DataModule.

    source.py               where the text comes from (`datasets` builder + files, or a Hub id), loaded with checks
    tokenizer.py            the tokenizer (our byte-level BPE, or a pretrained model's with its rules and chat)
    pretrained_tokenizer.py a pretrained model's tokenizer, from a Hugging Face folder or a GGUF vocabulary
    documents.py            documents -> ids: text in segments, conversations with their assistant mask
    settings.py             what decides the cache's contents and folder names; the `data.*` number rules
    tokenize_parts.py       the token cache's tokenize stage: the corpus cut into parts, tokenized in processes
    store.py                the data on disk: find, build, open it (token cache or streaming), sweep dead builds
    stream.py               streaming instead: batches tokenized live by each rank's readers, resumed exactly
    batches.py              the stored token stream (part files) and its training and validation batches
    datamodule.py           `TextDataModule`, the LightningDataModule that joins the stages (rank 0 builds)
    prepare.py              `python -m data.prepare`: build ahead what `train.py fit` would build

Importing the package loads only the standard library and `tokenizers` (`generate.py` needs just `Tokenizer`);
import the heavier parts from their modules, e.g. `from data.datamodule import TextDataModule`.
"""

from common.errors import UserError
from data.tokenizer import EOS_TOKEN, Tokenizer


class DataConfigError(UserError):
    """A data setting the user can fix: one line naming the `data.*` key (or the file) and what to change."""


__all__ = ["EOS_TOKEN", "DataConfigError", "Tokenizer"]
