"""Chat fine-tuning from a stream (`data.streaming: true`): each reader encodes its conversations as the token
cache does and carries the assistant mask into the targets; the validation set is masked the same way, and a bad
conversation is still one line naming its row.

Data and tokenizer are those of tests/data/test_data_chat.py (the tiny Llama 2 chat template).
"""

from __future__ import annotations

import itertools

import datasets
import pytest
import torch

from data import DataConfigError
from data.batches import IGNORE_INDEX, masked_pair
from data.datamodule import TextDataModule
from data.stream import StreamBatches
from tests.data.test_data_chat import BAD_ROWS, chat_data, chat_tokenizer, pirate_rows, write_rows


def stream_targets(rows: list[dict], batches: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of the first `batches` batches of a one-reader stream over `rows`, each (batches, 2, 32)."""
    docs = datasets.Dataset.from_list(rows).to_iterable_dataset()
    stream = StreamBatches(docs, "messages", chat_tokenizer(), frozenset(), 32, 2, chat=True)
    pairs = [(x, y) for x, y, _, _ in itertools.islice(stream.reader_batches(0, 1), batches)]
    return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def edited(rows: list[dict], role: str, tail: str) -> list[dict]:
    """`rows` with `tail` appended to the first conversation's first `role` message."""
    messages = [dict(m) for m in rows[0]["messages"]]
    index = next(i for i, m in enumerate(messages) if m["role"] == role)
    messages[index]["content"] += tail
    return [{"messages": messages}, *rows[1:]]


def test_stream_targets_are_the_assistant_tokens_only():
    """Mirrors tests/training/test_chat_finetune.py::test_only_the_assistant_targets_move_the_loss: one token of
    a user turn changed changes inputs but no target; one of an assistant turn changes a target."""
    rows, tokenizer = pirate_rows(8), chat_tokenizer()
    # " ~" and " ^" are the same two tokens but the byte-fallback one, so nothing else of the stream moves.
    a, b = (tokenizer.encode(f"Arr {c}", add_bos=False) for c in "~^")
    assert len(a) == len(b) and sum(i != j for i, j in zip(a, b, strict=True)) == 1
    for role, targets_move in (("user", False), ("assistant", True)):
        (x1, y1), (x2, y2) = (stream_targets(edited(rows, role, tail)) for tail in (" ~", " ^"))
        assert int((x1 != x2).sum()) == 1, role  # one input token differs
        assert (not torch.equal(y1, y2)) is targets_move, role
    x, y = stream_targets(rows)
    kept = y != IGNORE_INDEX
    assert kept.any() and not kept.all()
    # a kept target is the next token: (B, T) windows run back to back, so the next token of the last is y's
    following = torch.cat([x.flatten()[1:], y.flatten()[-1:]])
    assert torch.equal(y.flatten()[kept.flatten()], following[kept.flatten()])


def test_stream_pairs_equal_the_token_cache_pairs(tmp_path):
    """Every (input, target) pair of the train conversations and of the validation set, in numbers."""
    rows = pirate_rows(48)
    files = {
        "train": str(write_rows(tmp_path / "train.jsonl", rows[:40])),
        "validation": str(write_rows(tmp_path / "val.jsonl", rows[40:])),
    }
    modules = {}
    for streaming in (False, True):
        modules[streaming] = TextDataModule(
            dataset="json", data_files=files, chat_column="messages", cache_dir=str(tmp_path / "cache"),
            vocab_size=300, block_size=32, batch_size=4, streaming=streaming, val_docs=8,
        )  # fmt: skip
        modules[streaming].use_tokenizer(chat_tokenizer())
        modules[streaming].setup()
    cached, streamed = modules[False], modules[True]
    assert torch.equal(
        torch.as_tensor(cached.val_tokens.tolist()), torch.as_tensor(streamed.val_tokens.tolist())
    )
    assert torch.equal(torch.as_tensor(cached.val_mask.tolist()), torch.as_tensor(streamed.val_mask.tolist()))
    assert streamed.meta["val"] == cached.meta["val"]  # the bits-per-byte counts: assistant tokens only
    x_cached, y_cached = masked_pair(cached.train_tokens[:], cached.train_mask[:])
    batches = len(x_cached) // (4 * 32) + 2  # the first epoch of the stream and a little more
    pairs = list(itertools.islice(streamed.train_dataloader(), batches))
    x_stream = torch.cat([x.flatten() for x, _ in pairs])
    y_stream = torch.cat([y.flatten() for _, y in pairs])
    # The stream puts an EOS before its first conversation too; the cache starts the split without one.
    assert x_stream[0] == cached.tokenizer.eos_id and y_stream[0] == IGNORE_INDEX
    assert torch.equal(x_stream[1 : len(x_cached) + 1], x_cached)
    assert torch.equal(y_stream[1 : len(y_cached) + 1], y_cached)


@pytest.mark.parametrize(("name", "workers"), [(name, 0) for name in BAD_ROWS] + [("unknown role", 2)])
def test_a_bad_streamed_conversation_is_one_line_naming_its_row(name, workers, tmp_path):
    row, words = BAD_ROWS[name]
    rows = pirate_rows(30)
    rows.insert(7, row)
    files = write_rows(tmp_path / "bad.jsonl", rows)
    data = chat_data(
        files, tmp_path / "cache", chat_tokenizer(), streaming=True, val_docs=3, num_workers=workers
    )
    data.setup()
    with pytest.raises(DataConfigError) as caught:
        for _ in itertools.islice(data.train_dataloader(), 8):  # with 2 workers, row 7 is the second's
            pass
    message = str(caught.value)
    assert (
        "\n" not in message and "data.chat_column: row 7 of the train split" in message and words in message
    )


def test_a_bad_held_out_conversation_fails_the_setup_naming_its_row(tmp_path):
    row, words = BAD_ROWS["no assistant turn"]
    rows = pirate_rows(30)
    rows.insert(1, row)
    data = chat_data(write_rows(tmp_path / "bad.jsonl", rows), tmp_path / "cache", chat_tokenizer(),
                     streaming=True, val_docs=3)  # fmt: skip
    with pytest.raises(DataConfigError, match=f"^data.chat_column: row 1 of the train split: .*{words}"):
        data.setup()
