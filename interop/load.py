"""One entry point for every command: a model name in, our GPT and its own tokenizer out.

loaded = load_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")   # or a folder, .ckpt, run dir, .gguf
loaded.model, loaded.tokenizer, loaded.source
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from checkpoints.format import load_checkpoint, read_checkpoint
from common.errors import UserError
from data.pretrained_tokenizer import tokenizer_from_gguf, tokenizer_from_hf_folder
from data.tokenizer import Tokenizer
from model.gpt import GPT
from model.hf import from_hf_state_dict, load_hf_model, model_config_from_hf

from .gguf_blocks import keep_blocks
from .gguf_file import GGUFFile
from .hub import download_snapshot
from .source import PretrainedError, Source, classify


@dataclass
class Loaded:
    """A model in eval mode, the tokenizer it was trained with, and where both came from."""

    model: GPT
    tokenizer: Tokenizer
    source: Source


def resolve(name: str | Path, revision: str | None = None) -> Source:
    """The source behind `name`, a Hub id downloaded (or found in the cache) first."""
    kind, path = classify(name, revision)
    if kind == "hub":
        path = download_snapshot(str(name), revision)
    return Source(kind, path, str(name), revision)


def load_pretrained(
    name: str | Path,
    revision: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    keep_quantized: bool = False,
) -> Loaded:
    """Our GPT and tokenizer for any model name (see interop.source); `dtype` None keeps the stored one.

    `keep_quantized` (a .gguf file, float32): matrices stored as Q4_0, Q4_1 or Q8_0 stay in their blocks
    (model.quantized.QuantizedLinear): the same weights, ~5x smaller, read directly by the compiled step.
    """
    if keep_quantized and dtype not in (None, torch.float32):
        raise PretrainedError(f"keep_quantized computes in float32; drop the dtype {dtype} or keep_quantized")
    source = resolve(name, revision)
    if keep_quantized and source.kind != "gguf":
        raise PretrainedError(
            f"{name}: keep_quantized needs a .gguf file (its Q4_0, Q4_1 or Q8_0 blocks); this is a {source.kind}"
        )
    if source.kind == "checkpoint":
        checkpoint = load_checkpoint(source.path)
        model, tokenizer = checkpoint.model, Tokenizer.from_json(checkpoint.tokenizer_json)
    elif source.kind == "gguf":
        model, tokenizer = _load_gguf(source.path, keep_quantized)
    else:
        model, tokenizer = _load_hf_folder(source.path), tokenizer_from_hf_folder(source.path)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise PretrainedError(
            f"{source.path}: the tokenizer has {tokenizer.vocab_size} ids but the model only "
            f"{model.config.vocab_size} embeddings; the files belong to different models"
        )
    return Loaded(model.to(device=device, dtype=dtype).eval(), tokenizer, source)


def load_tokenizer(name: str | Path, revision: str | None = None) -> Tokenizer:
    """Only the tokenizer of a model name (no weights are read), e.g. for tokenizing a fine-tuning corpus."""
    source = resolve(name, revision)
    if source.kind == "checkpoint":
        checkpoint, _ = read_checkpoint(source.path)
        return Tokenizer.from_json(checkpoint["gqa_gpt"]["tokenizer_json"])
    if source.kind == "gguf":
        return tokenizer_from_gguf(GGUFFile(source.path).vocabulary(), str(source.path))
    return tokenizer_from_hf_folder(source.path)


def _load_hf_folder(folder: Path) -> GPT:
    try:
        return load_hf_model(folder)
    except ValueError as err:  # model.hf names the folder and field (its UserErrors are ValueErrors)
        raise PretrainedError(str(err)) from err


def _load_gguf(path: Path, keep_quantized: bool = False) -> tuple[GPT, Tokenizer]:
    file = GGUFFile(path)
    tokenizer = tokenizer_from_gguf(file.vocabulary(), str(path))
    try:
        config = model_config_from_hf(file.hf_config())
        state = from_hf_state_dict(file.hf_tensors(config.n_head, config.n_kv_head), config)
    except UserError:
        raise
    except ValueError as err:
        raise PretrainedError(f"{path}: {err}") from err
    model = GPT(config)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        reason = str(err).strip().splitlines()[-1].strip()
        raise PretrainedError(f"{path}: tensor shapes do not match the GGUF metadata ({reason})") from err
    if keep_quantized:
        keep_blocks(model, file.hf_blocks(config.n_head, config.n_kv_head))
    return model, tokenizer
