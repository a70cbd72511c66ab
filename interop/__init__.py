"""Every way a model enters or leaves: one name resolves the same for every command.

A name is our `.ckpt` / run directory / sharded folder, a Hugging Face model folder, a Hub id (`org/name`, with
an optional revision) or a llama.cpp `.gguf` file; see interop.source for the order it is tried in. Tensor names
of every format are one table (interop/names.py).
"""

from .hf_folder import load_hf
from .load import Loaded, load, read_config, read_tokenizer
from .source import PretrainedError, Source, resolve

__all__ = [
    "Loaded",
    "PretrainedError",
    "Source",
    "load",
    "load_hf",
    "read_config",
    "read_tokenizer",
    "resolve",
]
