"""Read a llama.cpp GGUF file of the `llama` architecture: dequantised weights, the model config, the vocabulary.

Tensors are dequantised to float32 with the `gguf` package (`gguf.quants.dequantize`) and renamed to Hugging
Face Llama names, with llama.cpp's q/k row order (adjacent RoPE pairs) turned back into rotate-half rows; the
config is written as a Hugging Face config.json dict. Both then go through model.hf, as a folder's would.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from data.pretrained_tokenizer import GGUFVocabulary
from interop.gguf_blocks import Blocks, read_blocks
from interop.gguf_layout import ARCHITECTURE, from_interleaved_rope

from .source import PretrainedError

_MISSING = object()
# llama.cpp tensor names of one block and their Hugging Face Llama names.
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def import_gguf() -> ModuleType:
    """The `gguf` package, or a one-line error saying how to install it."""
    try:
        import gguf
    except ImportError as err:
        raise PretrainedError(
            'loading a .gguf file needs the gguf package; pip install -e ".[gguf]"'
        ) from err
    return gguf


def _as_written(value: float) -> float:
    """The decimal a float32 metadata value was written from (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def rotate_half_rows(name: str, rows: torch.Tensor, n_head: int, n_kv_head: int) -> torch.Tensor:
    """The rows of tensor `name` (HF name) in rotate-half order: llama.cpp stores q/k with adjacent RoPE pairs."""
    if name.endswith("q_proj.weight"):
        return from_interleaved_rope(rows, n_head)
    if name.endswith("k_proj.weight"):
        return from_interleaved_rope(rows, n_kv_head)
    return rows


class GGUFFile:
    """One GGUF file opened for reading (memory-mapped: only what is asked for is read)."""

    def __init__(self, path: Path) -> None:
        gguf = import_gguf()
        self.path, self._gguf = path, gguf
        try:
            self._reader = gguf.GGUFReader(path)
        except Exception as err:  # the reader raises ValueError and struct/numpy errors for damaged files
            raise PretrainedError(
                f"{path}: cannot read this GGUF file ({type(err).__name__}); it is damaged"
            ) from err
        architecture = self.field("general.architecture")
        if architecture != ARCHITECTURE:
            raise PretrainedError(
                f"{path}: GGUF architecture {architecture!r} is not supported (only '{ARCHITECTURE}'); "
                "load the model's Hugging Face folder instead"
            )

    def field(self, key: str, default=_MISSING):
        """A metadata value as a plain Python value; a missing key without a default is one line naming it."""
        field = self._reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise PretrainedError(f"{self.path}: GGUF metadata lacks {key!r}; the file is incomplete")
            return default
        return field.contents()

    def hf_config(self) -> dict:
        """The Hugging Face Llama config.json this file's `llama.*` metadata describes."""
        arch = ARCHITECTURE
        heads = self.field(f"{arch}.attention.head_count")
        config = {
            "model_type": "llama",
            "vocab_size": self.field(f"{arch}.vocab_size", len(self.field("tokenizer.ggml.tokens"))),
            "max_position_embeddings": self.field(f"{arch}.context_length"),
            "num_hidden_layers": self.field(f"{arch}.block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.field(f"{arch}.attention.head_count_kv", heads),
            "hidden_size": self.field(f"{arch}.embedding_length"),
            "intermediate_size": self.field(f"{arch}.feed_forward_length"),
            "rms_norm_eps": _as_written(self.field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": _as_written(self.field(f"{arch}.rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in self._tensor_names(),
            "hidden_act": "silu",
        }
        head_dim = self.field(f"{arch}.attention.key_length", None)
        if head_dim is not None:
            config["head_dim"] = head_dim
        scaling = self.field(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":  # model.hf decides whether it can run it
            factor = self.field(f"{arch}.rope.scaling.factor", 1.0)
            config["rope_scaling"] = {"rope_type": scaling, "factor": factor}
        rotary = self.field(f"{arch}.rope.dimension_count", None)
        if rotary is not None and rotary != (head_dim or config["hidden_size"] // heads):
            raise PretrainedError(
                f"{self.path}: {arch}.rope.dimension_count={rotary} (partial RoPE) is not supported"
            )
        return config

    def hf_tensors(self, n_head: int, n_kv_head: int) -> dict[str, torch.Tensor]:
        """Every tensor dequantised to float32 under its Hugging Face name, q/k rows back in rotate-half order."""
        tensors = {}
        for tensor in self._reader.tensors:
            name = self._hf_name(tensor.name)
            try:
                array = self._gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            except NotImplementedError as err:
                raise PretrainedError(
                    f"{self.path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which cannot be "
                    "dequantised; convert the file to f16, bf16, q8_0 or another common quantisation"
                ) from err
            shape = [int(n) for n in reversed(tensor.shape)]  # GGUF lists the fastest-varying dimension first
            # A copy: F32 tensors are read-only views of the memory-mapped file.
            weight = torch.from_numpy(np.require(array, np.float32, ["C", "W"]).reshape(shape))
            tensors[name] = rotate_half_rows(name, weight, n_head, n_kv_head)
        return tensors

    def hf_blocks(self, n_head: int, n_kv_head: int) -> dict[str, Blocks]:
        """The Q4_0 / Q4_1 / Q8_0 matrices as block codes under their Hugging Face names, q/k rows in
        rotate-half order (interop.gguf_blocks)."""
        blocks = {}
        for tensor in self._reader.tensors:
            matrix = read_blocks(tensor.data, tensor.tensor_type.name) if len(tensor.shape) == 2 else None
            if matrix is None:
                continue
            name = self._hf_name(tensor.name)
            blocks[name] = matrix.rows(
                lambda rows, name=name: rotate_half_rows(name, rows, n_head, n_kv_head)
            )
        return blocks

    def _hf_name(self, name: str) -> str:
        match = BLOCK_NAME.match(name)
        if match and match.group(2) in BLOCK_TENSORS:
            return f"model.layers.{match.group(1)}.{BLOCK_TENSORS[match.group(2)]}.weight"
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and stem in TOP_TENSORS:
            return f"{TOP_TENSORS[stem]}.weight"
        hint = " (Llama 3.1 RoPE scaling)" if name == "rope_freqs.weight" else ""
        raise PretrainedError(
            f"{self.path}: tensor {name}{hint} is not part of the Llama layout gqa-gpt runs; load the model's "
            "Hugging Face folder instead"
        )

    def _tensor_names(self) -> set[str]:
        return {tensor.name for tensor in self._reader.tensors}

    def vocabulary(self) -> GGUFVocabulary:
        """The `tokenizer.ggml.*` vocabulary and the chat template."""
        tokens = list(self.field("tokenizer.ggml.tokens"))
        return GGUFVocabulary(
            model=self.field("tokenizer.ggml.model"),
            pre=self.field("tokenizer.ggml.pre", "default"),
            tokens=tokens,
            token_types=list(self.field("tokenizer.ggml.token_type", [1] * len(tokens))),
            merges=list(self.field("tokenizer.ggml.merges")),
            eos_id=self.field("tokenizer.ggml.eos_token_id"),
            bos_id=self.field("tokenizer.ggml.bos_token_id", None),
            add_bos=bool(self.field("tokenizer.ggml.add_bos_token", False)),
            chat_template=self.field("tokenizer.chat_template", None),
        )
