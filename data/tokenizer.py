"""Byte-level BPE tokenizer: trained with `tokenizers`, stored as tokenizer.json, identified by its sha256.

Imports only `tokenizers` and the standard library so `generate.py` can rebuild the tokenizer embedded in a
checkpoint without pulling in `datasets` or Lightning.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from common.errors import UserError, first_line
from common.files import atomic_write
from common.tokens import EOS_TOKEN

SPECIAL_TOKENS = (EOS_TOKEN,)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def _byte_to_char() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: every byte maps to one printable character, so vocab strings are text."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    next_free = 256
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(next_free)
            next_free += 1
    return mapping


class Tokenizer:
    """A byte-level BPE tokenizer with `<|endoftext|>` as document separator; any Unicode text round-trips."""

    def __init__(self, backend: BackendTokenizer) -> None:
        eos_id = backend.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise UserError(f"tokenizer has no {EOS_TOKEN} token; train it with data.Tokenizer.train")
        self._backend = backend
        self._eos_id = eos_id
        self._json = _canonical_json(backend.to_str())
        self._sha256 = hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    @classmethod
    def train(
        cls,
        texts: Iterable[str | list[str]],
        vocab_size: int,
        *,
        show_progress: bool = True,
        length: int | None = None,
    ) -> Tokenizer:
        """Train on `texts` (strings or batches of strings); the vocab holds all 256 bytes, so nothing is unknown."""
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
            show_progress=show_progress,
        )
        backend.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(backend)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Rebuild from the string `to_json()` returned (e.g. the copy embedded in a checkpoint)."""
        return cls(BackendTokenizer.from_str(text))

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
        """Write tokenizer.json atomically: a reader never sees half a file."""
        atomic_write(path, self._json)

    def to_json(self) -> str:
        """The canonical JSON string (sorted keys, compact); `sha256` is the hash of exactly this string."""
        return self._json

    @property
    def sha256(self) -> str:
        """Hex sha256 of `to_json()`: equal hashes mean identical token ids for every text."""
        return self._sha256

    @property
    def eos_id(self) -> int:
        """Id of `<|endoftext|>`, the separator placed between documents."""
        return self._eos_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids this tokenizer can produce (may be below the size asked for at training)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; a literal `<|endoftext|>` in the text becomes `eos_id`."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts at once (parallel inside `tokenizers`, no offsets computed)."""
        return [
            encoding.ids
            for encoding in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; special tokens are kept so `decode(encode(s)) == s` for every string."""
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> list[bytes]:
        """The UTF-8 bytes each id stands for (b"" for special tokens), indexed by id.

        Lets callers count bytes of a token stream without decoding it, and stream partial characters.
        """
        char_to_byte = {char: byte for byte, char in _byte_to_char().items()}
        table = [b""] * self.vocab_size
        specials = set(SPECIAL_TOKENS)
        for token, token_id in self._backend.get_vocab(with_added_tokens=True).items():
            if token not in specials:
                table[token_id] = bytes(char_to_byte[char] for char in token)
        return table

    def __reduce__(self) -> tuple:
        # Pickle as JSON: compact and independent of the backend's own pickle format (DataLoader/map workers).
        return (Tokenizer.from_json, (self._json,))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self._sha256[:12]}...)"


def _canonical_json(text: str) -> str:
    """Key order and whitespace never change the hash of a tokenizer."""
    return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
