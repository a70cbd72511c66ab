"""One entry point for every command: a model name in, our GPT, its config or its own tokenizer out.
The kind of source is decided once (interop.source.classify) and picks one `Reader`; nothing else branches on it.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from checkpoints.format import (
    LORA_KEY,
    META_KEY,
    STATE_PREFIX,
    check_lora_checkpoint,
    loaded_from,
    read_checkpoint,
)
from common.errors import OneLineParser, first_line
from common.files import refuse_existing
from data.tokenizer import Tokenizer
from interop.tokenizer_files import tokenizer_from_hf_folder
from model.config import ModelConfig
from model.gpt import GPT
from model.lora import LoRAConfig, add_lora, merge_lora

from .gguf_blocks import KEPT_TYPES
from .gguf_file import GGUFFile
from .hf_folder import load_hf, read_hf_config
from .source import DESCRIPTIONS, PretrainedError, Source, resolve


@dataclass
class Loaded:
    """A model in eval mode, the tokenizer it was trained with, and where both came from."""

    model: GPT
    tokenizer: Tokenizer
    source: Source


@dataclass(frozen=True)
class Reader:
    """How one kind of source gives its config, its tokenizer, and its model with the tokenizer."""

    config: Callable[[Path], ModelConfig]
    tokenizer: Callable[[Path], Tokenizer]
    model: Callable[[Path, bool], tuple[GPT, Tokenizer]]


def load(
    name: str | Path,
    revision: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    keep_quantized: bool = False,
) -> Loaded:
    """Our GPT and tokenizer for any model name (see interop.source); `dtype` None keeps the stored one.
    `keep_quantized` (a .gguf, float32) keeps KEPT_TYPES matrices in their blocks."""
    if keep_quantized and dtype not in (None, torch.float32):
        raise PretrainedError(f"keep_quantized computes in float32; drop the dtype {dtype} or keep_quantized")
    source = resolve(name, revision)
    if keep_quantized and source.kind != "gguf":
        raise PretrainedError(
            f"{name}: keep_quantized needs a .gguf file (its {', '.join(KEPT_TYPES)} blocks); this is "
            f"{DESCRIPTIONS[source.kind]}"
        )
    model, tokenizer = _reader(source).model(source.path, keep_quantized)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise PretrainedError(
            f"{source.path}: the tokenizer has {tokenizer.vocab_size} ids but the model only "
            f"{model.config.vocab_size} embeddings; the files belong to different models"
        )
    refuse_non_finite(model, source.path)
    return Loaded(model.to(device=device, dtype=dtype).eval(), tokenizer, source)


def refuse_non_finite(model: GPT, path: Path) -> None:
    """One line naming the first tensor that holds a NaN or an infinity: torch's CPU attention turns NaN queries
    into finite outputs, so a damaged q/k/v weight would otherwise decode plausible text."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            layer = name.split(".")[1] if name.startswith("blocks.") else None
            where = f" (layer {layer})" if layer is not None else ""
            raise PretrainedError(
                f"{path}: tensor {name}{where} holds NaN or infinite values; the file is damaged: download or "
                "export it again"
            )


def read_config(name: str | Path, revision: str | None = None) -> tuple[Source, ModelConfig]:
    """The source and ModelConfig of a model name; no weights are read."""
    source = resolve(name, revision)
    return source, _reader(source).config(source.path)


def read_tokenizer(name: str | Path, revision: str | None = None) -> Tokenizer:
    """Only the tokenizer of a model name (no weights are read), e.g. for tokenizing a fine-tuning corpus."""
    source = resolve(name, revision)
    return _reader(source).tokenizer(source.path)


def export_parser(prog: str, doc: str, out_help: str) -> argparse.ArgumentParser:
    """The options the export commands share: --checkpoint, --revision, --out, --force."""
    # The docstring's first paragraph: its first line may stop mid-sentence.
    parser = OneLineParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a .ckpt, run dir, HF folder, Hub id or .gguf")
    parser.add_argument("--revision", help="branch, tag or commit of a Hub id")
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--force", action="store_true", help="replace --out if it already exists")
    return parser


def load_for_export(args: argparse.Namespace, file: bool = False, suffixes: tuple[str, ...] = ()) -> Loaded:
    """The model of --checkpoint, once --out is known to be writable and not to overlap it (a checkpoint may
    take long to read)."""
    out, source = Path(args.out).expanduser(), Path(args.checkpoint).expanduser()
    refuse_existing(out, args.force, file=file, suffixes=suffixes, source=source)
    loaded = load(args.checkpoint, args.revision)  # a bad name is a UserError: one line, exit 2
    merge_lora(
        loaded.model
    )  # adapters kept beside a base's blocks go into its weights: exports hold one matrix
    return loaded


def _reader(source: Source) -> Reader:
    return READERS["hf_folder" if source.kind == "hub" else source.kind]  # a Hub id is its snapshot folder


def _checkpoint_model(path: Path, keep_quantized: bool) -> tuple[GPT, Tokenizer]:
    ckpt, file = read_checkpoint(path)
    tokenizer = Tokenizer.from_json(ckpt[META_KEY]["tokenizer_json"])
    if LORA_KEY in ckpt[META_KEY]:
        return _with_adapters(ckpt, file), tokenizer
    return loaded_from(ckpt, file).model, tokenizer


def _with_adapters(ckpt: dict, file: Path) -> GPT:
    """The base a LoRA checkpoint names, checked against its sha256, with the adapters on it: kept blocks (QLoRA)
    keep their adapters beside them; a float base takes them into its weights (merged: no cost per token)."""
    lora = ckpt[META_KEY][LORA_KEY]
    base = lora["base"]
    try:
        loaded = load(base["name"], base["revision"], keep_quantized=lora["keep_quantized"])
    except PretrainedError as err:
        raise PretrainedError(
            f"{file}: holds adapters for the base {base['name']}, which {first_line(err)}"
        ) from err
    model = add_lora(loaded.model, LoRAConfig(lora["rank"], lora["alpha"], 0.0, tuple(lora["targets"])))
    check_lora_checkpoint(ckpt, model, source_sha256(loaded.source), file)
    state = {name.removeprefix(STATE_PREFIX): tensor for name, tensor in ckpt["state_dict"].items()}
    model.load_state_dict(state, strict=False)
    return model if lora["keep_quantized"] else merge_lora(model)


def source_sha256(source: Source) -> str:
    """The sha256 of a source's weight files, in order (what a LoRA checkpoint records of its base)."""
    if source.kind == "gguf":
        files = [source.path]
    elif source.kind == "checkpoint":
        files = [read_checkpoint(source.path)[1]]
    else:
        files = sorted(source.path.glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


READERS = {
    "checkpoint": Reader(
        lambda path: ModelConfig(**read_checkpoint(path)[0][META_KEY]["model_config"]),
        lambda path: Tokenizer.from_json(read_checkpoint(path)[0][META_KEY]["tokenizer_json"]),
        _checkpoint_model,
    ),
    "hf_folder": Reader(
        read_hf_config,
        tokenizer_from_hf_folder,
        lambda path, _: (load_hf(path), tokenizer_from_hf_folder(path)),
    ),
    "gguf": Reader(
        lambda path: GGUFFile(path).model_config(),
        lambda path: GGUFFile(path).tokenizer(),
        lambda path, keep_quantized: GGUFFile(path).load(keep_quantized),
    ),
}
