"""The tokenizer: our byte-level BPE trained with `tokenizers`, or a pretrained model's own with its `TokenRules`
(EOS/BOS ids, chat template), stored together in one JSON string so one sha256 covers everything that decides ids:
a plain `tokenizers` JSON (our own BPE) or `{WRAPPER_KEY: {"tokenizer": <that JSON>, "rules": {...}}}`.

Imports only `tokenizers` and the standard library (jinja2 when a chat is rendered), so `generate.py` stays light.
Chat templates are untrusted text from a model folder, so they run in jinja2's immutable sandbox.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from common.errors import UserError, first_line
from common.files import atomic_write

EOS_TOKEN = "<|endoftext|>"  # placed between documents in training; ends generation
WRAPPER_KEY = "gqa_gpt_tokenizer"  # a key `tokenizers` itself never uses
SPECIAL_TOKENS = (EOS_TOKEN,)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
SENTENCEPIECE_SPACE = "\u2581"  # how sentencepiece-style vocabularies (Llama 2) spell a space


@dataclass(frozen=True)
class TokenRules:
    """How a model uses its special tokens."""

    # The ids that end a text (Llama 3 Instruct has three); the first separates documents.
    eos_ids: tuple[int, ...]
    bos_id: int | None = None
    add_bos: bool = False  # whether `encode` puts `bos_id` first by default (Llama does, SmolLM2 does not)
    chat_template: str | None = None  # jinja2

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))
        if not self.eos_ids:
            raise UserError("the tokenizer has no EOS id; set eos_token_id in generation_config.json")
        if self.add_bos and self.bos_id is None:
            raise UserError(
                "the tokenizer adds a BOS token but names none; set bos_token in tokenizer_config.json"
            )


class Tokenizer:
    """Our byte-level BPE or a pretrained model's tokenizer and rules. Without `rules` the backend must hold
    `<|endoftext|>`, which then is the only EOS id, and there is no BOS: our BPE's one rule."""

    def __init__(self, backend: BackendTokenizer, rules: TokenRules | None = None) -> None:
        own_eos = backend.token_to_id(EOS_TOKEN)
        default = TokenRules((own_eos,)) if own_eos is not None else None
        rules = rules or default
        if rules is None:
            raise UserError(f"tokenizer has no {EOS_TOKEN} token; train it with data.Tokenizer.train")
        size = backend.get_vocab_size(with_added_tokens=True)
        for token_id in (*rules.eos_ids, rules.bos_id):
            if token_id is not None and not 0 <= token_id < size:
                raise UserError(f"special token id {token_id} is outside the tokenizer's {size} ids")
        self._backend, self.rules = backend, rules
        self.vocab_size = size  # the ids it can produce: may be fewer than training asked for
        self.eos_ids, self.bos_id, self.add_bos = rules.eos_ids, rules.bos_id, rules.add_bos
        self.eos_id = rules.eos_ids[0]  # the separator placed between documents
        self.chat_template = rules.chat_template
        self._plain = rules == default

    # The JSON forms and the hash are computed when first asked for: two parses of a 49k-token vocabulary's JSON
    # were a tenth of generate.py's start, which needs none of them.
    @cached_property
    def backend_json(self) -> str:
        """The `tokenizers` JSON alone (what a tokenizer.json file of an export holds)."""
        return _canonical(json.loads(self._backend.to_str()))

    @cached_property
    def _json(self) -> str:
        # Our own BPE keeps its plain tokenizer.json (and so the sha256 of every existing cache and checkpoint).
        if self._plain:
            return self.backend_json
        wrapper = {WRAPPER_KEY: {"rules": asdict(self.rules), "tokenizer": json.loads(self.backend_json)}}
        return _canonical(wrapper)

    @cached_property
    def sha256(self) -> str:
        """Of `to_json()`: equal hashes mean identical token ids for every text."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    @classmethod
    def train(
        cls, texts: Iterable[str | list[str]], vocab_size: int, *, show_progress: bool | None = None
    ) -> Tokenizer:
        """Train on `texts` (strings or batches of strings); the vocab holds all 256 bytes, so nothing is unknown.
        Progress bars only on a terminal by default: elsewhere `tokenizers` writes blank lines into the log."""
        if vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size {vocab_size} is below {MIN_VOCAB_SIZE} (256 bytes + special tokens)"
            )
        backend = BackendTokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,  # a pair seen once never helps compress unseen text
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=sys.stdout.isatty() if show_progress is None else show_progress,
        )
        backend.train_from_iterator(texts, trainer=trainer)
        return cls(backend)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Rebuild from the string `to_json()` returned (e.g. the copy embedded in a checkpoint)."""
        backend_json, rules = split_tokenizer_json(text)
        return cls(BackendTokenizer.from_str(backend_json), TokenRules(**rules) if rules else None)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a tokenizer.json written by `save` (or any `tokenizers` file that has `<|endoftext|>`)."""
        path = Path(path).expanduser()
        try:
            return cls.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise
        except Exception as error:  # tokenizers raises bare Exception subclasses for malformed files
            raise UserError(f"{path} is not a tokenizers JSON file: {first_line(error)}") from error

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write(path, self._json)  # a reader never sees half a file

    def to_json(self) -> str:
        """The canonical JSON string that `sha256` hashes: our BPE's plain tokenizer.json, or the rules' wrapper."""
        return self._json

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The chat `messages` ({"role", "content"} dicts) as text, through the model's chat template; with
        `add_generation_prompt` it ends with the opening of an assistant turn, where the model writes."""
        import jinja2.exceptions

        if self.chat_template is None:
            raise UserError("this model's tokenizer has no chat template; prompt it with plain text instead")
        tokens = {"bos_token": self.token_text(self.bos_id) or "", "eos_token": self.token_text(self.eos_id)}
        try:
            return _compiled(self.chat_template).render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **tokens
            )
        except jinja2.exceptions.TemplateError as err:
            raise UserError(f"the model's chat template refused the messages: {first_line(err)}") from err

    def token_text(self, token_id: int | None) -> str | None:
        """The vocabulary entry of one id (None for None): how config files name a special token."""
        return None if token_id is None else self._backend.id_to_token(token_id)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, after `bos_id` if `add_bos` (default: the model's rule; False for text that holds
        its BOS, such as a rendered chat); a literal special token (`<|endoftext|>`, `<|im_start|>`) is its id."""
        return self._with_bos(self._backend.encode(text, add_special_tokens=False).ids, add_bos)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The ids a decode starts from: BOS first if the model's rule says so; an empty prompt without one starts
        from the end-of-text token, the separator every training document follows."""
        return self.encode(prompt) or [self.eos_id]

    def until_stop(self, ids: Sequence[int]) -> list[int]:
        """`ids` cut before the first stop id (any of `eos_ids`: Qwen Instruct lists two)."""
        ids = list(ids)
        return ids[: next((i for i, t in enumerate(ids) if t in self.eos_ids), len(ids))]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` (no BOS: rendered chat text carries its own) and each token's character span."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def encode_batch(self, texts: Sequence[str], add_bos: bool | None = None) -> list[list[int]]:
        """Token ids of many texts at once (parallel inside `tokenizers`, no offsets computed)."""
        return [
            self._with_bos(encoding.ids, add_bos)
            for encoding in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        ]

    def _with_bos(self, ids: list[int], add_bos: bool | None) -> list[int]:
        add = self.add_bos if add_bos is None else add_bos
        return [self.bos_id, *ids] if add and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; special tokens are kept so `decode(encode(s)) == s` for every string."""
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> list[bytes]:
        """The UTF-8 bytes each id stands for (b"" for special tokens), indexed by id."""
        spec = json.loads(self.backend_json)
        added = {token["content"]: token for token in spec.get("added_tokens", [])}
        spell = _byte_level_bytes if "ByteLevel" in json.dumps(spec.get("decoder")) else _sentencepiece_bytes
        table = [b""] * self.vocab_size
        for token, token_id in self._backend.get_vocab(with_added_tokens=True).items():
            if token in added and not _is_byte_token(token):  # a byte-fallback token is a byte even if added
                # Special tokens stand for no text; other added tokens for their own.
                table[token_id] = b"" if added[token].get("special") else token.encode("utf-8")
            else:
                table[token_id] = spell(token)
        return table

    def __reduce__(self) -> tuple:
        # Pickle as JSON: compact and independent of the backend's own pickle format (DataLoader/map workers).
        return (Tokenizer.from_json, (self._json,))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]}...)"


# The GPT-2 byte-level alphabet: printable bytes stand for themselves, the others for chr(256), chr(257), ...
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_UNPRINTABLE = [byte for byte in range(256) if byte not in _PRINTABLE]
_CHAR_TO_BYTE = {chr(byte): byte for byte in _PRINTABLE} | {
    chr(256 + i): b for i, b in enumerate(_UNPRINTABLE)
}


def _byte_level_bytes(token: str) -> bytes:
    """A byte-level BPE token's bytes: each character of its spelling stands for one byte."""
    try:
        return bytes(_CHAR_TO_BYTE[char] for char in token)
    except KeyError:  # a token spelled outside the byte alphabet (a mislabelled added token): its own text
        return token.encode("utf-8")


def _is_byte_token(token: str) -> bool:
    """`<0xNN>`: a sentencepiece byte-fallback token."""
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


def _sentencepiece_bytes(token: str) -> bytes:
    """A sentencepiece-style token's bytes: `<0xNN>` is byte NN (byte fallback), the meta space a space."""
    if _is_byte_token(token):
        return bytes([int(token[3:5], 16)])
    return token.replace(SENTENCEPIECE_SPACE, " ").encode("utf-8")


def split_tokenizer_json(text: str) -> tuple[str, dict | None]:
    """(the `tokenizers` JSON, the rules dict or None) of a tokenizer string."""
    spec = json.loads(text)
    if isinstance(spec, dict) and WRAPPER_KEY in spec:
        inner = spec[WRAPPER_KEY]
        return json.dumps(inner["tokenizer"], ensure_ascii=False), dict(inner["rules"])
    return text, None


def _canonical(value: object) -> str:
    """Key order and whitespace never change the hash of a tokenizer."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def to_json(value, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = to_json
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise UserError(
            f"the model's chat template is not valid jinja2 (line {err.lineno}): {err.message}"
        ) from err
