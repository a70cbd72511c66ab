"""data.Tokenizer: exact round trips for any Unicode text, stable sha256, save/load and light imports."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from data import EOS_TOKEN, Tokenizer

HARD_STRINGS = [
    "",
    "plain ASCII words.",
    "naïve café Straße — «quote»",
    "日本語のテキスト、中文，한국어",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "combining e\u0301 vs é, zero width \u200b joiner \u200d",
    "controls \x00\x01\x1f\x7f tab\t cr\r crlf\r\n nbsp\xa0 ideographic\u3000space",
    "  leading and trailing spaces  \n\n\n",
    f"a literal {EOS_TOKEN} inside text",
    "\U0010ffff private \ue000 use",
]


@pytest.fixture(scope="module")
def tokenizer(shakespeare_text: str) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:100_000]], vocab_size=400, show_progress=False)


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_any_unicode_text_round_trips_exactly(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


def test_shakespeare_round_trips_and_compresses(tokenizer: Tokenizer, shakespeare_text: str) -> None:
    held_out = shakespeare_text[-50_000:]  # never seen in training
    ids = tokenizer.encode(held_out)
    assert tokenizer.decode(ids) == held_out
    assert 1.5 < len(held_out) / len(ids) < 3.0, "400 merges on English should give ~2 characters per token"


def test_vocab_has_requested_size_eos_and_all_bytes(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 400
    assert tokenizer.encode(EOS_TOKEN) == [tokenizer.eos_id]
    assert tokenizer.decode([tokenizer.eos_id]) == EOS_TOKEN
    single_bytes = [piece for piece in tokenizer.token_bytes() if len(piece) == 1]
    assert sorted(single_bytes) == [bytes([b]) for b in range(256)]


def test_token_bytes_add_up_to_the_utf8_text(tokenizer: Tokenizer) -> None:
    table = tokenizer.token_bytes()
    for text in HARD_STRINGS:
        ids = tokenizer.encode(text)
        assert b"".join(table[i] for i in ids) == text.replace(EOS_TOKEN, "").encode("utf-8")


def test_encode_batch_matches_encode(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode_batch(HARD_STRINGS) == [tokenizer.encode(text) for text in HARD_STRINGS]


def test_json_file_and_pickle_round_trips_keep_the_sha(tokenizer: Tokenizer, tmp_path: Path) -> None:
    assert len(tokenizer.sha256) == 64
    assert Tokenizer.from_json(tokenizer.to_json()).sha256 == tokenizer.sha256
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.sha256 == tokenizer.sha256
    assert loaded.encode(HARD_STRINGS[4]) == tokenizer.encode(HARD_STRINGS[4])
    assert pickle.loads(pickle.dumps(tokenizer)).sha256 == tokenizer.sha256
    assert list(tmp_path.iterdir()) == [tmp_path / "tokenizer.json"], "save() must not leave temp files"


def test_sha_ignores_json_formatting_but_not_content(tokenizer: Tokenizer, tmp_path: Path) -> None:
    pretty = json.dumps(json.loads(tokenizer.to_json()), indent=4)  # same tokenizer, different bytes
    (tmp_path / "pretty.json").write_text(pretty, encoding="utf-8")
    assert Tokenizer.from_file(tmp_path / "pretty.json").sha256 == tokenizer.sha256
    other = Tokenizer.train(["a different corpus, a different vocabulary " * 50], 300, show_progress=False)
    assert other.sha256 != tokenizer.sha256


def test_training_is_deterministic(shakespeare_text: str) -> None:
    text = shakespeare_text[:30_000]
    first = Tokenizer.train([text], 300, show_progress=False)
    second = Tokenizer.train([text], 300, show_progress=False)
    assert first.sha256 == second.sha256


def test_bad_vocab_and_bad_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="257"):
        Tokenizer.train(["text"], 256)
    (tmp_path / "bogus.json").write_text('{"not": "a tokenizer"}', encoding="utf-8")
    with pytest.raises(ValueError, match="bogus.json"):
        Tokenizer.from_file(tmp_path / "bogus.json")


def test_importing_the_tokenizer_stays_light() -> None:
    """generate.py imports the tokenizer; it must not drag in datasets, Lightning, torch or numpy."""
    code = (
        "import sys; import data; from data import Tokenizer, DataConfigError; import data.tokenizer; "
        "print(sorted(m for m in ('datasets', 'lightning', 'torch', 'numpy', 'pyarrow') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
