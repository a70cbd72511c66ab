"""Export a model to one GGUF file that llama.cpp, Ollama, LM Studio and llama-cpp-python load.

    python -m interop.export_gguf --checkpoint runs/x --out x.gguf [--dtype f32|f16|bf16|q8_0] [--force]

The architecture follows the options: `llama` (Llama 3's RoPE scaling as its `rope_freqs` tensor), `qwen2` for
q/k/v biases, `qwen3` for q/k RMSNorm; only a byte-level BPE vocabulary is written (docs/interop.md).
Needs the optional `gguf` package: pip install -e ".[gguf]".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import torch

from common.errors import UserError, run_command
from common.files import atomic_path, refuse_existing
from data.tokenizer import Tokenizer
from interop.tokenizer_files import (
    GGUF_CONTROL,
    GGUF_NORMAL,
    GGUF_UNUSED,
    GGUF_USER_DEFINED,
    GGUFVocabulary,
)
from model.attention import inverse_frequencies
from model.config import ModelConfig
from model.gpt import GPT

from . import pre_tokenizers
from .gguf_file import HYPERPARAMETERS, VOCABULARY, import_gguf
from .hf_folder import hf_config_dict, hf_model_type
from .load import export_parser, load_for_export
from .names import INTERLEAVED, to_format

SUFFIXES = (".gguf",)  # what llama.cpp and Ollama look for
GGUFDtype = Literal["f32", "f16", "bf16", "q8_0"]
# Each --dtype's gguf.LlamaFileType.
FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
Q8_0_BLOCK = 32  # q8_0 quantises rows in blocks of 32 values
# How a metadata value of each Python type is written (llama.cpp reads counts and ids as uint32).
ADD = {bool: "add_bool", int: "add_uint32", float: "add_float32", str: "add_string", list: "add_array"}


def export_gguf(
    model: GPT,
    tokenizer: Tokenizer,
    out: str | Path,
    dtype: GGUFDtype = "f32",
    force: bool = False,
    tokenizer_name: str = "the tokenizer",
) -> Path:
    """Write `model` and its tokenizer as a llama.cpp GGUF file at `out` (replaced only with `force`, atomically).
    Norms stay float32, as llama.cpp keeps 1-D tensors; under q8_0, rows not a multiple of 32 fall back to f16."""
    gguf = import_gguf()
    out = Path(out).expanduser()
    refuse_existing(out, force, file=True, suffixes=SUFFIXES)
    if dtype not in FILE_TYPES:
        raise UserError(f"--dtype {dtype!r} is not one of {', '.join(FILE_TYPES)}")
    architecture = gguf_architecture(model.config)  # before writing anything: an unsupported mix is refused
    vocab = gguf_vocab(tokenizer, model.config.vocab_size, tokenizer_name)
    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, architecture)
        write_metadata(gguf, writer, model, vocab, dtype, name=out.stem)
        for name, tensor in gguf_tensors(model).items():
            data, raw_dtype = encode_tensor(gguf, tensor, dtype)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        write_out(writer)
    return out


def write_out(writer) -> None:
    """Write a filled GGUFWriter's header, metadata and tensors to its file, and close it."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def write_metadata(gguf, writer, model: GPT, vocab: GGUFVocabulary, dtype: GGUFDtype, name: str) -> None:
    """Architecture hyperparameters and the `gpt2` tokenizer with its pre-tokenizer, keyed as llama.cpp reads them."""
    c = model.config
    architecture = gguf_architecture(c)
    hf = hf_config_dict(c, torch.float32, None, None)
    values = {f"{architecture}.{key}": hf[hf_key] for key, hf_key in HYPERPARAMETERS.items()}
    values |= {
        f"{architecture}.attention.value_length": c.head_dim,
        f"{architecture}.rope.dimension_count": c.head_dim,
        f"{architecture}.rope.freq_base": float(c.rope_theta),
        f"{architecture}.attention.layer_norm_rms_epsilon": float(c.norm_eps),
        "general.name": name,
        "general.file_type": int(getattr(gguf.LlamaFileType, FILE_TYPES[dtype])),
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }
    # The tokenizer's own rule (data/tokenizer.py): our BPE has no BOS, and llama.cpp must not prepend one.
    values |= {VOCABULARY[field]: value for field, value in vars(vocab).items() if value is not None}
    for key, value in values.items():
        getattr(writer, ADD[type(value)])(key, value)


def encode_tensor(gguf, tensor: torch.Tensor, dtype: GGUFDtype):
    """(numpy data, raw ggml type or None) of one float32 tensor in the export dtype."""
    array = tensor.numpy()
    if dtype == "f32" or array.ndim == 1:
        return array, None
    if dtype == "f16" or (dtype == "q8_0" and array.shape[-1] % Q8_0_BLOCK):
        return array.astype("float16"), None
    qtype = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(array, qtype), qtype


def gguf_architecture(config: ModelConfig) -> str:
    """The llama.cpp architecture that computes what `config` computes, or a one-line UserError."""
    if config.rope_type == "llama3" and (config.qkv_bias or config.qk_norm):
        raise UserError(
            "rope_type llama3 is written for llama.cpp's llama architecture only, not with model.qkv_bias "
            "or model.qk_norm"
        )
    return hf_model_type(config)  # llama.cpp names these three as config.json's model_type does


def gguf_tensors(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under llama.cpp names, float32 CPU copies, q and k rows in the architecture's RoPE layout
    (a tied output is left out: llama.cpp then uses token_embd.weight)."""
    c = model.config
    tensors = to_format(model.state_dict(), c, "gguf", interleave=gguf_architecture(c) in INTERLEAVED)
    if c.rope_type == "llama3":
        tensors["rope_freqs.weight"] = llama3_freq_factors(c)
    return {name: t.to("cpu", torch.float32, copy=True).contiguous() for name, t in tensors.items()}


def llama3_freq_factors(config: ModelConfig) -> torch.Tensor:
    """llama.cpp's `rope_freqs` (D/2,): the number each plain RoPE frequency is divided by under llama3."""
    rope = config.rope
    plain = inverse_frequencies(rope.head_dim, rope.theta)
    return plain / inverse_frequencies(rope.head_dim, rope.theta, rope.llama3)


def gguf_vocab(tokenizer: Tokenizer, vocab_size: int, source: str = "the tokenizer") -> GGUFVocabulary:
    """A byte-level BPE tokenizer and its rules as a `gpt2` GGUF vocabulary of exactly `vocab_size` rows, the
    ones past the tokenizer's size unused padding (llama.cpp needs one per embedding row)."""
    spec = json.loads(tokenizer.backend_json)
    check_byte_level_bpe(spec, source)
    pre = pre_tokenizers.llamacpp_name(spec, source)
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    added = {token["content"]: token for token in spec.get("added_tokens", [])}
    vocab |= {content: int(token["id"]) for content, token in added.items()}
    if len(set(vocab.values())) != len(vocab) or max(vocab.values()) >= vocab_size:
        raise UserError(
            f"tokenizer ids do not fit the model's vocab_size={vocab_size}; the checkpoint is inconsistent"
        )
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [GGUF_UNUSED] * vocab_size
    for content, token_id in vocab.items():
        tokens[token_id] = content
        special = content in added and added[content].get("special", False)
        types[token_id] = GGUF_CONTROL if special else GGUF_USER_DEFINED if content in added else GGUF_NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    rules = tokenizer.rules
    return GGUFVocabulary("gpt2", pre, tokens, types, merges, rules.eos_ids[0], rules.bos_id,
                          rules.add_bos, rules.chat_template)  # fmt: skip


def check_byte_level_bpe(spec: dict, source: str) -> None:
    """Raise a one-line UserError unless tokenizer.json's model merges as llama.cpp's `gpt2` BPE does."""
    model = spec.get("model") or {}
    checks = [
        ("model.type", model.get("type") == "BPE", "only BPE tokenizers are supported"),
        ("model.byte_fallback", not model.get("byte_fallback"), "byte fallback is not byte-level BPE"),
        ("model.dropout", model.get("dropout") in (None, 0.0), "BPE dropout makes tokenization random"),
        ("model.continuing_subword_prefix", not model.get("continuing_subword_prefix"), "llama.cpp has none"),
        ("model.end_of_word_suffix", not model.get("end_of_word_suffix"), "llama.cpp has no suffix"),
    ]
    for token in spec.get("added_tokens", []):  # llama.cpp matches an added token exactly where it stands
        for flag in ("lstrip", "rstrip", "single_word"):
            checks.append(
                (f"added_tokens {token['content']!r} {flag}", not token.get(flag), "llama.cpp ignores it")
            )
    for field, ok, why in checks:
        if not ok:
            raise UserError(f"{source}: tokenizer.json field {field} cannot be written for llama.cpp: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = export_parser(
        "python -m interop.export_gguf", __doc__, "file to create, e.g. exports/<run>.gguf"
    )
    parser.add_argument(
        "--dtype",
        choices=FILE_TYPES,
        default="f32",
        help="weight type (default: f32; norms always stay f32)",
    )
    args = parser.parse_args(argv)
    import_gguf()  # before reading a possibly large checkpoint
    loaded = load_for_export(args, file=True, suffixes=SUFFIXES)
    name = f"the tokenizer of {args.checkpoint}"
    out = export_gguf(loaded.model, loaded.tokenizer, args.out, args.dtype, args.force, tokenizer_name=name)
    print(
        f'exported {loaded.source} -> {out} ({args.dtype}); run it with: llama-completion -m {out} -no-cnv -p "..."'
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
