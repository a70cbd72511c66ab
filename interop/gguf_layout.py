"""What a GGUF file of our model holds, in llama.cpp's layouts: tensor names, metadata and vocabulary.

Torch and the standard library only; interop/export_gguf.py hands these to the `gguf` writer. The architecture
follows the options: `llama` by default (with Llama 3's RoPE scaling as its `rope_freqs` tensor), `qwen2` for
q/k/v biases, `qwen3` for per-head q/k RMSNorm; other combinations are refused in one line.

The tensor names and which q/k rows `llama` interleaves are interop/names.py's table.
"""

from __future__ import annotations

import json

import torch

from common.errors import UserError
from data import pre_tokenizers
from data.pretrained_tokenizer import (
    GGUF_CONTROL,
    GGUF_NORMAL,
    GGUF_UNUSED,
    GGUF_USER_DEFINED,
    GGUFVocabulary,
)
from data.tokenizer import Tokenizer
from model.attention import inverse_frequencies
from model.config import ModelConfig
from model.gpt import GPT

from .hf_config import hf_model_type
from .names import INTERLEAVED, to_format


def gguf_architecture(config: ModelConfig) -> str:
    """The llama.cpp architecture that computes what `config` computes, or a one-line UserError."""
    if config.rope_type == "llama3" and (config.qkv_bias or config.qk_norm):
        raise UserError(
            "rope_type llama3 is written for llama.cpp's llama architecture only, not with model.qkv_bias "
            "or model.qk_norm"
        )
    return hf_model_type(config)  # llama.cpp names these three as config.json's model_type does


def gguf_tensors(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under llama.cpp names, float32 copies on the CPU, q and k rows in the architecture's RoPE layout.

    A tied output projection is left out: llama.cpp uses token_embd.weight when output.weight is absent.
    """
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


def hyperparameters(model: GPT) -> dict[str, int | float]:
    """The `<architecture>.*` metadata values llama.cpp reads, keyed by the GGUF key suffix."""
    c = model.config
    return {
        "context_length": c.block_size,
        "embedding_length": c.n_embd,
        "block_count": c.n_layer,
        "feed_forward_length": c.hidden_dim,
        "attention.head_count": c.n_head,
        "attention.head_count_kv": c.n_kv_head,
        "attention.key_length": c.head_dim,
        "attention.value_length": c.head_dim,
        "rope.dimension_count": c.head_dim,
        "rope.freq_base": float(c.rope_theta),
        "attention.layer_norm_rms_epsilon": float(c.norm_eps),
        "vocab_size": c.vocab_size,
    }


def gguf_vocab(tokenizer: Tokenizer, vocab_size: int, source: str = "the tokenizer") -> GGUFVocabulary:
    """A byte-level BPE tokenizer and its rules as a `gpt2` GGUF vocabulary of exactly `vocab_size` rows.

    The pre-tokenizer is named as llama.cpp knows it (data/pre_tokenizers.py: `gpt-2` for our own BPE).
    Rows past the tokenizer's size (a model may hold a larger embedding) become unused padding tokens, as
    llama.cpp needs one token per embedding row. Anything llama.cpp would split or merge differently is a
    UserError naming `source`, so no file tokenizes differently from us.
    """
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
