"""Segments tokenize exactly like whole documents; separators and the held-out character cut."""

from __future__ import annotations

import random

import numpy as np
import pytest

from data import Tokenizer
from data.documents import CharCut, find_char_cut, segment_batch, segment_documents, split_at_safe_newlines

# Characters that stress the pre-tokenizer's whitespace rules around newlines.
_ALPHABET = [
    "a",
    "b",
    "é",
    "😀",
    "1",
    "'",
    "s",
    ".",
    " ",
    "  ",
    "\n",
    "\n",
    "\t",
    "\r",
    "\u3000",
    "\xa0",
    "\x1c",
]


def _random_text(rng: random.Random, max_len: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, max_len)))


@pytest.fixture(scope="module")
def tokenizer(shakespeare_text: str) -> Tokenizer:
    """Trained partly on whitespace soup, so it has merges such as "\\n\\n" and " \\n" that a bad cut would split."""
    rng = random.Random(1)
    texts = [shakespeare_text[:100_000], *(_random_text(rng, 200) for _ in range(2000))]
    tokenizer = Tokenizer.train(texts, vocab_size=600, show_progress=False)
    assert len(tokenizer.encode("\n\n")) == 1 and len(tokenizer.encode(" \n")) == 1
    return tokenizer


def _segment_ids(tokenizer: Tokenizer, text: str, max_chars: int) -> list[int]:
    return [i for piece in split_at_safe_newlines(text, max_chars) for i in tokenizer.encode(piece)]


def test_adversarial_segments_tokenize_like_the_whole(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    cuts = 0
    for _ in range(400):
        text = _random_text(rng, 120)
        pieces = split_at_safe_newlines(text, max_chars=4)
        cuts += len(pieces) - 1
        assert "".join(pieces) == text
        assert _segment_ids(tokenizer, text, 4) == tokenizer.encode(text), repr(text)
    assert cuts > 500, "the strings must actually get cut for this test to mean anything"


def test_shakespeare_segments_tokenize_like_the_whole(tokenizer: Tokenizer, shakespeare_text: str) -> None:
    text = shakespeare_text[:300_000]
    pieces = split_at_safe_newlines(text, max_chars=1000)
    assert len(pieces) > 250
    assert all(piece.endswith("\n") for piece in pieces[:-1])
    assert _segment_ids(tokenizer, text, 1000) == tokenizer.encode(text)


def test_training_on_segments_equals_training_on_the_document(shakespeare_text: str) -> None:
    text = shakespeare_text[:60_000]
    whole = Tokenizer.train([text], 350, show_progress=False)
    segmented = Tokenizer.train(split_at_safe_newlines(text, 2000), 350, show_progress=False)
    assert segmented.sha256 == whole.sha256


def test_text_without_safe_newlines_stays_whole() -> None:
    text = "x" * 50 + "\n\n" + "y" * 50 + " \n" + "z" * 50
    assert split_at_safe_newlines(text, max_chars=10) == [text]


def test_separators_go_between_non_empty_documents() -> None:
    segments = segment_documents(
        ["ab\ncd", "", None, "ef", "g"], [True, False, False, False, False], max_chars=2
    )
    assert segments["text"] == ["ab\n", "cd", "ef", "g"]
    assert segments["separator_before"] == [False, False, True, True]


def test_segment_batch_clips_the_first_and_last_row() -> None:
    batch = {"text": ["0123456789", "abcdef", "ABCDEF"]}
    head = segment_batch(batch, [0, 1, 2], column="text", first_offset=0, last_index=2, last_limit=3)
    assert head["text"] == ["0123456789", "abcdef", "ABC"]
    tail = segment_batch(batch, [0, 1, 2], column="text", first_offset=4, last_index=-1, last_limit=None)
    assert tail["text"] == ["456789", "abcdef", "ABCDEF"]
    assert tail["separator_before"] == [False, True, True]
    same_row = segment_batch(
        {"text": ["0123456789"]}, [0], column="text", first_offset=2, last_index=0, last_limit=6
    )
    assert same_row["text"] == ["2345"], "the end is in original coordinates, so it is clipped first"


@pytest.mark.parametrize(
    ("lengths", "val_fraction", "expected"),
    [
        ([1115394], 0.1, CharCut(0, 1003854)),  # nanoGPT's shakespeare_char split point
        ([3, 0, 5, 2], 0.3, CharCut(2, 4)),  # character 7 of 10 is offset 4 of the third document
        ([5, 5], 0.5, CharCut(1, 0)),  # a cut on a document boundary starts the next document
        ([0, 4, 0, 6], 0.5, CharCut(3, 1)),
    ],
)
def test_char_cut(lengths: list[int], val_fraction: float, expected: CharCut) -> None:
    assert find_char_cut(np.array(lengths), val_fraction) == expected
