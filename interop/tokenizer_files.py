"""A pretrained model's own tokenizer: from a Hugging Face folder (tokenizer.json, and its rules from
tokenizer_config.json, chat_template.jinja and generation_config.json), or from a GGUF file's vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as BackendTokenizer

from common.errors import UserError, first_line
from data.tokenizer import Tokenizer, TokenRules, split_tokenizer_json

from . import pre_tokenizers
from .model_files import check_ids, check_types, read_json_object

# Token types of a GGUF vocabulary (gguf.TokenType): control tokens are special, user-defined ones are added,
# unused ones pad the vocabulary to the embedding's rows.
GGUF_NORMAL, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED = 1, 3, 4, 5


def tokenizer_from_hf_folder(folder: Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model folder, with its BOS/EOS rules and chat template."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"{folder}: no tokenizer.json; this model ships no fast tokenizer, which gqa-gpt needs"
        )
    try:
        backend = BackendTokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises bare Exception subclasses for malformed files
        raise UserError(f"{path} is not a tokenizers JSON file: {first_line(err)}") from err
    config = _read_json(folder / "tokenizer_config.json")
    generation = read_generation_config(folder)
    if not generation:  # the ids may be in config.json alone
        generation = _read_json(folder / "config.json")
        check_ids(generation, folder / "config.json", ("bos_token_id", "eos_token_id"))
    bos_id = _token_id(backend, config.get("bos_token"), generation.get("bos_token_id"))
    add_bos = config.get("add_bos_token")
    if add_bos is None:  # no flag: the post-processor tells, as for Llama 3 (TemplateProcessing adds BOS)
        add_bos = bos_id is not None and _post_processor_adds(json.loads(backend.to_str()), bos_id)
    eos_ids = _ids(generation.get("eos_token_id"))
    own_eos = _token_id(backend, config.get("eos_token"), None)
    if own_eos is not None and own_eos not in eos_ids:
        eos_ids.insert(0, own_eos)
    if not eos_ids:
        raise UserError(f"{folder}: no EOS token in tokenizer_config.json or generation_config.json; add one")
    rules = TokenRules(tuple(eos_ids), bos_id, bool(add_bos), _chat_template(folder, config))
    return Tokenizer(backend, rules)


def same_backend(path: Path, tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer file at `path` (a plain tokenizer.json or our wrapper) holds `tokenizer`'s pipeline."""
    backend_json, _ = split_tokenizer_json(path.read_text(encoding="utf-8"))
    return json.loads(backend_json) == json.loads(tokenizer.backend_json)


# The generation_config.json fields we read and their types (transformers' GenerationConfig names).
GENERATION_TYPES = {"do_sample": bool, "top_k": int} | dict.fromkeys(
    ("temperature", "top_p", "min_p", "repetition_penalty"), float
)


def read_generation_config(folder: Path) -> dict:
    """A model folder's generation_config.json ({} without one), every field we read type-checked: the sampling
    defaults and the BOS/EOS ids."""
    path = folder / "generation_config.json"
    generation = _read_json(path)
    check_types(generation, path, GENERATION_TYPES, nullable=("top_k", "min_p"))
    check_ids(generation, path, ("bos_token_id", "eos_token_id", "pad_token_id"))
    return generation


def _read_json(path: Path) -> dict:
    return read_json_object(path) if path.is_file() else {}


def _token_id(backend: BackendTokenizer, token, fallback_id) -> int | None:
    """The id of a tokenizer_config token entry (a string or an AddedToken dict), else `fallback_id` (the first of a list)."""
    content = token.get("content") if isinstance(token, dict) else token
    token_id = backend.token_to_id(content) if content else None
    return token_id if token_id is not None else (_ids(fallback_id) or [None])[0]


def _ids(value) -> list[int]:
    return [] if value is None else [int(i) for i in (value if isinstance(value, list) else [value])]


def _post_processor_adds(spec: dict, bos_id: int) -> bool:
    """Whether tokenizer.json's post-processor puts `bos_id` first in a single sequence."""
    processor = spec.get("post_processor") or {}
    steps = processor.get("processors", [processor]) if processor.get("type") == "Sequence" else [processor]
    for step in steps:
        single = step.get("single") or []
        if step.get("type") == "TemplateProcessing" and single and "SpecialToken" in single[0]:
            token = single[0]["SpecialToken"]["id"]
            return bos_id in step.get("special_tokens", {}).get(token, {}).get("ids", [])
    return False


def _chat_template(folder: Path, config: dict) -> str | None:
    """chat_template.jinja (what transformers 5 writes) or tokenizer_config's entry (a string or named list)."""
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template


@dataclass(frozen=True)
class GGUFVocabulary:
    """The `tokenizer.ggml.*` values of a GGUF file, as plain Python values."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    eos_id: int
    bos_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None


def tokenizer_from_gguf(vocab: GGUFVocabulary, source: str) -> Tokenizer:
    """A byte-level BPE tokenizer built from a GGUF vocabulary; other kinds are one UserError naming `source`."""
    if vocab.model != "gpt2":
        raise UserError(
            f"{source}: tokenizer.ggml.model={vocab.model!r} is not supported (only 'gpt2' byte-level BPE); "
            "load the model's Hugging Face folder instead"
        )
    form = pre_tokenizers.readable(vocab.pre)
    if form is None:
        known = ", ".join([*pre_tokenizers.PRE_TOKENIZERS, *pre_tokenizers.READ_AS])
        raise UserError(
            f"{source}: tokenizer.ggml.pre={vocab.pre!r} is not supported (only {known}); "
            "load the model's Hugging Face folder instead"
        )
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in vocab.merges]
    model = models.BPE(vocab=ids, merges=merges, fuse_unk=False, ignore_merges=form.ignore_merges)
    backend = BackendTokenizer(model)
    backend.pre_tokenizer, normalizer = pre_tokenizers.build(form)
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.decoder = decoders.ByteLevel()
    # Added tokens keep their vocabulary ids and are matched whole in any text, as llama.cpp does.
    typed = list(zip(vocab.tokens, vocab.token_types, strict=True))
    for kind, add in ((GGUF_CONTROL, backend.add_special_tokens), (GGUF_USER_DEFINED, backend.add_tokens)):
        picked = [token for token, token_kind in typed if token_kind == kind]
        add([AddedToken(token, special=kind == GGUF_CONTROL, normalized=False) for token in picked])
    rules = TokenRules((vocab.eos_id,), vocab.bos_id, vocab.add_bos, vocab.chat_template)
    return Tokenizer(backend, rules)
