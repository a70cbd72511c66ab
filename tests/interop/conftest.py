"""Fixtures for loading pretrained models: tiny random transformers Llamas saved as Hugging Face folders.

The tokenizer is Llama 2's kind (sentencepiece-style BPE with byte fallback, `<s>` added in front, `</s>` to
stop), so nothing here has our `<|endoftext|>`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from tests.tiny_models import encode, make_model, tokenizer, tokenizer_json, transformers  # noqa: F401 (shared fixtures)

WORDS = "the cat sat on the mat héllo wörld naïve 日本語 don't 🙂 Ελληνικά".split()
LLAMA2_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + eos_token }}{% endif %}{% endfor %}"
)
STOP_IDS = [2, 3]  # generation_config.json lists two EOS ids: </s> and <eot>


def llama2_backend() -> BackendTokenizer:
    """A 300-token sentencepiece-style BPE: meta-space words, byte fallback, a post-processor that adds <s>."""
    texts = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(8)) for i in range(200)]
    backend = BackendTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first", split=False
    )
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>", "<eot>"] + [f"<0x{byte:02X}>" for byte in range(256)]
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return backend


def save_llama(
    transformers,  # noqa: F811
    folder: Path,
    *,
    shard: bool,
    tie: bool = False,
    std: float = 0.1,
    backend: BackendTokenizer | None = None,
    **shape,
) -> torch.nn.Module:
    """A random LlamaForCausalLM with GQA and its tokenizer saved to `folder` as safetensors.

    The tokenizer is Llama 2's kind unless `backend` (e.g. our byte-level BPE, `<|endoftext|>` its only EOS) is
    given; `shape` overrides LlamaConfig fields; `std` is the spread of the random weights (larger: livelier).
    """
    ids = {"bos_token_id": 1, "eos_token_id": STOP_IDS} if backend is None else {"bos_token_id": None}
    if backend is not None:
        ids["eos_token_id"] = backend.token_to_id("<|endoftext|>")
    config = transformers.LlamaConfig(**{
        "vocab_size": 300 if backend is None else backend.get_vocab_size(), "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rope_theta": 500.0, "tie_word_embeddings": tie, **ids, **shape,
    })  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():  # larger than init, so the logits are far from uniform
            param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3 if "norm" in name else std)
    model.save_pretrained(folder, max_shard_size="40KB" if shard else "1GB")
    if backend is None:
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=llama2_backend(), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
        tokenizer.chat_template = LLAMA2_CHAT
    else:
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(ids))
    return model


@pytest.fixture
def llama_folder(transformers, tmp_path):  # noqa: F811
    """(transformers model, folder) of a single-file safetensors Llama."""
    folder = tmp_path / "llama"
    return save_llama(transformers, folder, shard=False), folder
