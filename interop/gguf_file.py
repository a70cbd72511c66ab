"""Read a llama.cpp GGUF file (architectures `llama`, `qwen2`, `qwen3`): weights, the model config, the vocabulary.

Tensors are dequantised to float32 by the `gguf` package; the metadata becomes a Hugging Face config.json dict,
so interop/hf_folder.py decides what can run, as for a folder.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from data.tokenizer import Tokenizer
from interop.tokenizer_files import GGUFVocabulary, tokenizer_from_gguf
from model.config import ModelConfig
from model.gpt import GPT

from .gguf_blocks import Blocks, dequantized, keep_blocks, matrices, read_blocks, stacked
from .gguf_header import Header
from .hf_folder import assign, empty_model, model_config_from_hf
from .names import (
    INTERLEAVED,
    check_layer_count,
    check_stored,
    from_format,
    from_interleaved_rope,
    own_tensors,
)
from .source import PretrainedError

_MISSING = object()
# llama.cpp's architectures our block computes exactly, named as config.json's model_type names them.
ARCHITECTURES = ("llama", "qwen2", "qwen3")
# The GGUF keys the reader and the writer share: `<architecture>.<key>` -> its config.json key, and the
# GGUFVocabulary field -> its `tokenizer.*` key.
HYPERPARAMETERS = {"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
                   "block_count": "num_hidden_layers", "embedding_length": "hidden_size",
                   "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads",
                   "attention.head_count_kv": "num_key_value_heads", "attention.key_length": "head_dim",
                   "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta"}  # fmt: skip
VOCABULARY = {"model": "tokenizer.ggml.model", "pre": "tokenizer.ggml.pre", "tokens": "tokenizer.ggml.tokens",
              "token_types": "tokenizer.ggml.token_type", "merges": "tokenizer.ggml.merges",
              "eos_id": "tokenizer.ggml.eos_token_id", "bos_id": "tokenizer.ggml.bos_token_id",
              "add_bos": "tokenizer.ggml.add_bos_token", "chat_template": "tokenizer.chat_template"}  # fmt: skip


def import_gguf() -> ModuleType:
    """The `gguf` package, or a one-line error saying how to install it."""
    try:
        import gguf
    except ImportError as err:
        raise PretrainedError(
            'reading or writing GGUF files needs the gguf package; pip install -e ".[gguf]"'
        ) from err
    return gguf


def _as_written(value: float) -> float:
    """The decimal a float32 metadata value was written from (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


class GGUFFile:
    """One GGUF file opened for reading (memory-mapped: only what is asked for is read)."""

    def __init__(self, path: Path) -> None:
        gguf = import_gguf()
        self.path, self._gguf = path, gguf
        try:
            header = Header(path, lambda type_id: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)])
        except (ValueError, KeyError, struct.error, UnicodeDecodeError) as err:  # what a damaged file raises
            raise PretrainedError(
                f"{path}: cannot read this GGUF file ({type(err).__name__}); it is damaged"
            ) from err
        self._header, self._fields, self._tensors = header, header.fields, header.tensors
        self.architecture = self.field("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise PretrainedError(
                f"{path}: GGUF architecture {self.architecture!r} is not supported (only "
                f"{', '.join(ARCHITECTURES)}); load the model's Hugging Face folder instead"
            )

    def field(self, key: str, default=_MISSING):
        """A metadata value as a plain Python value; a missing key without a default is one line naming it."""
        if key not in self._fields:
            if default is _MISSING:
                raise PretrainedError(f"{self.path}: GGUF metadata lacks {key!r}; the file is incomplete")
            return default
        return self._fields[key]

    def model_config(self) -> ModelConfig:
        """Our ModelConfig of this file's `<architecture>.*` metadata; anything we cannot run is one line."""
        arch = self.architecture
        heads = self.field(f"{arch}.attention.head_count")
        defaults = {"vocab_size": len(self.field(VOCABULARY["tokens"])), "attention.head_count_kv": heads,
                    "attention.key_length": None, "attention.layer_norm_rms_epsilon": 1e-5,
                    "rope.freq_base": 10000.0}  # fmt: skip
        config = {
            name: self.field(f"{arch}.{key}", defaults.get(key, _MISSING))
            for key, name in HYPERPARAMETERS.items()
        }
        config |= {
            "model_type": arch,
            "rms_norm_eps": _as_written(config["rms_norm_eps"]),
            "rope_theta": _as_written(config["rope_theta"]),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "hidden_act": "silu",
        }
        scaling = self.field(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":  # interop.hf_folder decides whether it can run it
            factor = self.field(f"{arch}.rope.scaling.factor", 1.0)
            config["rope_scaling"] = {"rope_type": scaling, "factor": factor}
        rotary = self.field(f"{arch}.rope.dimension_count", None)
        if rotary is not None and rotary != (config["head_dim"] or config["hidden_size"] // heads):
            raise PretrainedError(
                f"{self.path}: {arch}.rope.dimension_count={rotary} (partial RoPE) is not supported"
            )
        return model_config_from_hf(config, str(self.path))

    def load(self, keep_quantized: bool = False) -> tuple[GPT, Tokenizer]:
        """Our GPT of this file (float32) and its tokenizer, read first so a vocabulary we cannot run is refused
        before any weight. With `keep_quantized`, a linear layer stored as KEPT_TYPES keeps its block codes.

        Like llama.cpp, no float model is built first: each tensor goes from the memory-mapped file into the
        model, one at a time (a kept matrix into its blocks, never to float32; any other converted once), so the
        peak is about the model's own size (at 1 B parameters a float detour needed 6x a Q4_K_M file).
        """
        tokenizer = self.tokenizer()
        config = self.model_config()
        check_layer_count(self._tensors, config, "gguf", f"{self.path}: {self.architecture}.block_count")
        model = empty_model(config)
        expected = own_tensors(model.state_dict(), config)
        shapes = {name: tuple(int(n) for n in reversed(t.shape)) for name, t in self._tensors.items()}
        check_stored(shapes, config, expected, "gguf", f"{self.path}:")
        interleaved = self.architecture in INTERLEAVED
        if keep_quantized:
            rotate = _rotate_blocks if interleaved else None
            for name in matrices(model):  # one matrix at a time: its unpacked codes are transient
                keep_blocks(model, from_format([name], config, "gguf", self._blocks, stacked, rotate))
                self._header.release()  # and so are the file's pages it read
        # What is still on the meta device is float: the norms, biases, an embedding or matrices not kept.
        floats = [name for name, tensor in own_tensors(model.state_dict(), config).items() if tensor.is_meta]
        rotate = from_interleaved_rope if interleaved else None
        assign(model, from_format(floats, config, "gguf", self._float, torch.cat, rotate))
        return model, tokenizer

    def _float(self, name: str) -> torch.Tensor | None:
        tensor = self._tensors.get(name)
        if tensor is None:
            return None
        blocks = self._blocks(name)
        if blocks is not None:  # in chunks: numpy's dequantisation held ~4 float copies (SmolLM2's embedding)
            converted = dequantized(blocks)
            self._header.release()
            return converted
        kind = self._gguf.GGMLQuantizationType(tensor.type_id)
        try:
            array = self._gguf.quants.dequantize(tensor.data, kind)
        except NotImplementedError as err:
            raise PretrainedError(
                f"{self.path}: tensor {tensor.name} has type {kind.name}, which cannot be "
                "dequantised; convert the file to f16, bf16, q8_0 or another common quantisation"
            ) from err
        shape = [int(n) for n in reversed(tensor.shape)]  # GGUF lists the fastest-varying dimension first
        # A copy: F32 tensors are read-only views of the memory-mapped file.
        converted = torch.from_numpy(np.require(array, np.float32, ["C", "W"]).reshape(shape))
        self._header.release()
        return converted

    def _blocks(self, name: str) -> Blocks | None:
        tensor = self._tensors.get(name)
        if tensor is None:
            return None
        return read_blocks(tensor.data, self._gguf.GGMLQuantizationType(tensor.type_id).name)

    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the `tokenizer.ggml.*` vocabulary and chat template."""
        types = [1] * len(self.field(VOCABULARY["tokens"]))  # a file without types: every token normal
        defaults = dict(pre="default", token_types=types, bos_id=None, add_bos=False, chat_template=None)
        vocab = GGUFVocabulary(
            **{name: self.field(key, defaults.get(name, _MISSING)) for name, key in VOCABULARY.items()}
        )
        return tokenizer_from_gguf(vocab, str(self.path))


def _rotate_blocks(matrix: Blocks, heads: int) -> Blocks:
    """The same matrix with its rows of codes, scale and minimum put back in rotate-half order."""
    minimum = None if matrix.minimum is None else from_interleaved_rope(matrix.minimum, heads)
    codes, scale = (from_interleaved_rope(t, heads) for t in (matrix.codes, matrix.scale))
    return matrix._replace(codes=codes, scale=scale, minimum=minimum)
