"""Export a model to one GGUF file that llama.cpp, Ollama, LM Studio and llama-cpp-python load.

    python -m interop.export_gguf --checkpoint runs/x --out x.gguf [--dtype f32|f16|bf16|q8_0] [--force]

--checkpoint is any model name `interop` resolves. Only a byte-level BPE (`gpt2`) vocabulary is written, with
the pre-tokenizer llama.cpp knows it by (`gpt-2` for our own BPE; `smollm`, `qwen2`, `llama-bpe` for those
models' tokenizers: data/pre_tokenizers.py); another (a sentencepiece-style tokenizer with byte fallback, an
unknown split) is refused with one line naming it.

Needs the optional `gguf` package: pip install -e ".[gguf]". The file is written under a temporary name in
the same folder and renamed into place, so an interrupted export never leaves a partial file at `--out`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import Literal

import torch

from common.errors import UserError, run_command
from common.files import atomic_path, refuse_existing
from data.tokenizer import Tokenizer
from model.gpt import GPT

from .gguf_file import import_gguf
from .gguf_layout import gguf_architecture, gguf_tensors, gguf_vocab, hyperparameters
from .load import load

GGUFDtype = Literal["f32", "f16", "bf16", "q8_0"]
FILE_TYPES = {
    "f32": "ALL_F32",
    "f16": "MOSTLY_F16",
    "bf16": "MOSTLY_BF16",
    "q8_0": "MOSTLY_Q8_0",
}  # gguf.LlamaFileType
GGUF_DTYPES: tuple[GGUFDtype, ...] = tuple(FILE_TYPES)  # type: ignore[assignment]
Q8_0_BLOCK = 32  # q8_0 quantises rows in blocks of 32 values


def export_gguf(
    model: GPT,
    tokenizer: Tokenizer,
    out: str | Path,
    dtype: GGUFDtype = "f32",
    force: bool = False,
    tokenizer_name: str = "the tokenizer",
) -> Path:
    """Write `model` and its tokenizer as a llama.cpp GGUF file at `out` and return its path.

    The architecture is `llama`, or `qwen2` / `qwen3` for the Qwen options (interop/gguf_layout.py).

    Norm weights stay float32 whatever `dtype` is (llama.cpp keeps 1-D tensors in f32); with q8_0, a matrix
    whose rows are not a multiple of 32 falls back to f16. An existing `out` is replaced only with `force`.
    A tokenizer llama.cpp would tokenize differently is a UserError naming `tokenizer_name`.
    """
    gguf = import_gguf()
    out = Path(out).expanduser()
    refuse_existing(out, force, file=True)
    if dtype not in GGUF_DTYPES:
        raise UserError(f"--dtype {dtype!r} is not one of {', '.join(GGUF_DTYPES)}")
    architecture = gguf_architecture(model.config)  # before writing anything: an unsupported mix is refused
    vocab = gguf_vocab(tokenizer, model.config.vocab_size, tokenizer_name)
    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, architecture)
        write_metadata(gguf, writer, model, vocab, dtype, name=out.stem)
        for name, tensor in gguf_tensors(model).items():
            data, raw_dtype = encode_tensor(gguf, tensor, dtype)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return out


def write_metadata(gguf: ModuleType, writer, model: GPT, vocab, dtype: GGUFDtype, name: str) -> None:
    """Architecture hyperparameters and the `gpt2` tokenizer with its pre-tokenizer, keyed as llama.cpp reads them."""
    writer.add_name(name)
    writer.add_file_type(int(getattr(gguf.LlamaFileType, FILE_TYPES[dtype])))
    for key, value in hyperparameters(model).items():
        full_key = f"{gguf_architecture(model.config)}.{key}"
        if isinstance(value, float):
            writer.add_float32(full_key, value)
        else:
            writer.add_uint32(full_key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    # The tokenizer's own rule (data/tokenizer.py): our BPE has no BOS, and llama.cpp must not prepend one.
    if vocab.bos_id is not None:
        writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def encode_tensor(gguf: ModuleType, tensor: torch.Tensor, dtype: GGUFDtype):
    """(numpy data, raw ggml type or None) of one float32 tensor in the export dtype."""
    array = tensor.numpy()
    if dtype == "f32" or array.ndim == 1:
        return array, None
    if dtype == "f16" or (dtype == "q8_0" and array.shape[-1] % Q8_0_BLOCK):
        return array.astype("float16"), None
    qtype = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(array, qtype), qtype


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m interop.export_gguf", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", required=True, help="a .ckpt, run dir, HF folder, Hub id or .gguf")
    parser.add_argument("--revision", help="branch, tag or commit of a Hub id")
    parser.add_argument("--out", required=True, help="file to create, e.g. exports/<run>.gguf")
    parser.add_argument(
        "--dtype",
        choices=GGUF_DTYPES,
        default="f32",
        help="weight type (default: f32; norms always stay f32)",
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it already exists")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: writes the file and prints how to run it."""
    args = parse_args(argv)
    import_gguf()  # before reading a possibly large checkpoint
    refuse_existing(Path(args.out).expanduser(), args.force, file=True)
    loaded = load(args.checkpoint, args.revision)  # a bad name is a UserError: one line, exit 2
    name = f"the tokenizer of {args.checkpoint}"
    out = export_gguf(loaded.model, loaded.tokenizer, args.out, args.dtype, args.force, tokenizer_name=name)
    print(
        f'exported {loaded.source} -> {out} ({args.dtype}); run it with: llama-completion -m {out} -no-cnv -p "..."'
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
