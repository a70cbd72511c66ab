"""Conversations (`data.chat_column`): rendered with the chat template, masked to the assistant's tokens, stored
beside the token parts; every bad conversation is one line naming its row.

The tokenizer is the tiny Llama 2 kind of tests/interop/conftest.py with its chat template, which puts `<s>` in
front, wraps user turns in [INST] ... [/INST] and closes each assistant turn with `</s>`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data import DataConfigError
from data.datamodule import TextDataModule
from data.tokenizer import Tokenizer, TokenRules
from tests.interop.conftest import LLAMA2_CHAT, llama2_backend

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "corpora" / "pirate-chat.jsonl"


def chat_tokenizer(template: str | None = LLAMA2_CHAT) -> Tokenizer:
    return Tokenizer(
        llama2_backend(), TokenRules(eos_ids=(2,), bos_id=1, add_bos=True, chat_template=template)
    )


def pirate_rows(count: int = 60) -> list[dict]:
    """The shipped conversations without their system turns (the Llama 2 template refuses those)."""
    rows = [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines()[:count]]
    return [{"messages": [m for m in row["messages"] if m["role"] != "system"]} for row in rows]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat_data(files: Path, cache: Path, tokenizer: Tokenizer | None = None, **kwargs) -> TextDataModule:
    settings = {"vocab_size": 300, "block_size": 32, "batch_size": 2, **kwargs}
    data = TextDataModule(
        dataset="json", data_files=str(files), chat_column="messages", cache_dir=str(cache), **settings
    )
    if tokenizer is not None:
        data.use_tokenizer(tokenizer)
    return data


@pytest.fixture(scope="module")
def chat_module(tmp_path_factory) -> tuple[TextDataModule, list[dict]]:
    """A set-up chat data module over 60 shipped conversations, and those rows."""
    work = tmp_path_factory.mktemp("chat")
    rows = pirate_rows()
    data = chat_data(write_rows(work / "chat.jsonl", rows), work / "cache", chat_tokenizer())
    data.setup()
    return data, rows


def masked_runs(tokenizer: Tokenizer, tokens, mask) -> list[str]:
    """The text of each run of consecutive masked tokens."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [
        tokenizer.decode(tokens[a:b].tolist()).strip() for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


def test_the_mask_marks_each_assistant_turn_and_its_end_of_turn_token(chat_module):
    data, rows = chat_module
    assert len(data.train_mask) == len(data.train_tokens) and len(data.val_mask) == len(data.val_tokens)
    runs = masked_runs(data.tokenizer, data.train_tokens, data.train_mask)
    runs += masked_runs(data.tokenizer, data.val_tokens, data.val_mask)
    turns = [m["content"] + "</s>" for row in rows for m in row["messages"] if m["role"] == "assistant"]
    assert (
        runs == turns
    )  # every assistant turn, its </s> included, and nothing of the user's or the template's


def test_conversations_are_packed_with_one_unmasked_eos_between_them(chat_module):
    data, rows = chat_module
    tokens, mask = np.asarray(data.train_tokens), np.asarray(data.train_mask)
    starts = np.flatnonzero(tokens == data.tokenizer.bos_id)  # the template begins each conversation with <s>
    assert starts[0] == 0 and (tokens[starts[1:] - 1] == data.tokenizer.eos_id).all()
    assert not mask[starts[1:] - 1].any()  # the separator is no assistant token
    assert data.meta["val_source"] == "the last 0.1 of the train split's conversations"


def test_the_held_out_conversations_are_whole_and_follow_the_train_ones(chat_module):
    data, rows = chat_module
    val = np.asarray(data.val_tokens)
    assert val[0] == data.tokenizer.bos_id  # a conversation's start, not a cut inside one
    train_starts = int((np.asarray(data.train_tokens) == data.tokenizer.bos_id).sum())
    assert train_starts + int((val == data.tokenizer.bos_id).sum()) == len(rows)


def test_batches_ignore_every_target_outside_the_assistant_tokens(chat_module):
    from data.batches import IGNORE_INDEX

    data, _ = chat_module
    batches = data.train_batches()
    for index in range(4):
        x, y = batches.batch(index)
        again = data.train_batches(start_batch=index).batch(index)
        assert all(torch.equal(a, b) for a, b in zip((x, y), again, strict=True))  # a function of the index
        kept = y != IGNORE_INDEX
        assert kept.any() and not kept.all()
        assert torch.equal(x[:, 1:][kept[:, :-1]], y[:, :-1][kept[:, :-1]])  # a kept target is the next token
    val_x, val_y = data.val_dataloader().dataset[0]
    assert (val_y == IGNORE_INDEX).any() and val_x.shape == val_y.shape


def test_a_chat_cache_is_never_the_text_cache_of_the_same_file(tmp_path):
    rows = [{**row, "text": " ".join(m["content"] for m in row["messages"])} for row in pirate_rows(80)]
    files = write_rows(tmp_path / "both.jsonl", rows)
    text = TextDataModule(dataset="json", data_files=str(files), vocab_size=300, block_size=16,
                          cache_dir=str(tmp_path / "cache"))  # fmt: skip
    text.use_tokenizer(chat_tokenizer())
    text.setup()
    chat = chat_data(files, tmp_path / "cache", chat_tokenizer())
    chat.setup()
    assert text.folder != chat.folder and "masks" not in text.meta and "masks" in chat.meta
    assert text.train_mask is None and chat.train_mask is not None


BAD_ROWS = {
    "no assistant turn": ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
    "unknown role": (
        {"messages": [{"role": "pirate", "content": "hi"}, {"role": "assistant", "content": "Arr!"}]},
        "role 'pirate'",
    ),
    "not a list": ({"messages": "hi"}, "non-empty list of messages"),
    "no content": ({"messages": [{"role": "user"}, {"role": "assistant", "content": "Arr!"}]}, "'content'"),
    # The Llama 2 template raises on a system turn.
    "template refuses": (
        {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "Arr!"}]},
        "roles must alternate",
    ),
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_conversation_is_one_line_naming_its_row(name, tmp_path):
    row, words = BAD_ROWS[name]
    rows = pirate_rows(30)
    rows.insert(7, row)
    data = chat_data(write_rows(tmp_path / "bad.jsonl", rows), tmp_path / "cache", chat_tokenizer())
    with pytest.raises(DataConfigError) as caught:
        data.setup()
    message = str(caught.value)
    assert (
        "\n" not in message and "data.chat_column: row 7 of the train split" in message and words in message
    )


def test_a_template_that_does_not_grow_turn_by_turn_is_refused(tmp_path):
    reversed_template = "{% for m in messages | reverse %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    data = chat_data(write_rows(tmp_path / "c.jsonl", pirate_rows(20)), tmp_path / "cache",
                     chat_tokenizer(reversed_template))  # fmt: skip
    with pytest.raises(DataConfigError, match="row 0 .* not render message 1 as a continuation"):
        data.setup()


@pytest.mark.parametrize("tokenizer", [None, chat_tokenizer(template=None)], ids=["our-bpe", "no-template"])
def test_chat_needs_a_tokenizer_with_a_chat_template(tokenizer, tmp_path):
    data = chat_data(write_rows(tmp_path / "c.jsonl", pirate_rows(20)), tmp_path / "cache", tokenizer)
    with pytest.raises(DataConfigError, match="data.chat_column: .* chat template.*model.init_from"):
        data.setup()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.bin"))


def test_chat_refuses_the_text_builder(tmp_path):
    files = write_rows(tmp_path / "c.jsonl", pirate_rows(20))
    with pytest.raises(DataConfigError, match="data.dataset"):
        TextDataModule(dataset="text", data_files=str(files), chat_column="messages")
