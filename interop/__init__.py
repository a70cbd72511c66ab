"""Every way a model enters or leaves: one name (a .ckpt, run dir, HF folder, Hub id or .gguf) resolves the same
for every command (docs/pretrained.md); tensor names of every format are one table (interop/names.py)."""

from .hf_folder import load_hf
from .load import Loaded, load, read_config, read_tokenizer, source_sha256
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
    "source_sha256",
]
