"""Pretrained models from anywhere, as our GPT with its own tokenizer: one name resolves the same for every command.

A name is our `.ckpt` / run directory / sharded folder, a Hugging Face model folder, a Hub id (`org/name`, with
an optional revision) or a llama.cpp `.gguf` file; see interop.source for the order it is tried in.
"""

from .load import Loaded, load_pretrained, load_tokenizer, resolve
from .source import PretrainedError, Source

__all__ = ["Loaded", "PretrainedError", "Source", "load_pretrained", "load_tokenizer", "resolve"]
