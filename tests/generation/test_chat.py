"""generate.py --chat: turns through the chat template, the KV cache kept between turns, bad setups refused.

Every forward the model runs is recorded (its token count and the tokens themselves), so the tests see exactly
what each turn prefilled.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

import generate as cli
from generation import chat as chat_module
from generation.chat import common_prefix
from tests.conftest import run_generate
from tests.interop.conftest import save_llama, transformers  # noqa: F401 (fixture)

TURNS = ["the cat sat on the mat", "héllo wörld"]


@pytest.fixture
def chat_llama(transformers, tmp_path):  # noqa: F811
    folder = tmp_path / "llama"
    save_llama(transformers, folder, shard=False, std=0.2)
    return folder


def record_forwards(monkeypatch) -> list[list[int]]:
    """The token ids of every forward of the model generate.py loads, in order."""
    calls, real_load = [], cli.load

    def load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        loaded.model.register_forward_pre_hook(lambda _, inputs: calls.append(inputs[0][0].tolist()))
        return loaded

    monkeypatch.setattr(cli, "load", load)
    return calls


def chat(capsys, monkeypatch, folder, turns, *flags) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(turns) + "\n"))
    return run_generate(capsys, "--checkpoint", str(folder), "--chat", *flags)


def turn_prefills(calls: list[list[int]]) -> list[list[int]]:
    """The multi-token forwards (prefills); the one-token ones are decode steps, except a one-token prefill."""
    return [ids for ids in calls if len(ids) > 1]


def test_second_turn_prefills_only_what_the_cache_lacks(chat_llama, capsys, monkeypatch):
    calls, replies, real_reply = record_forwards(monkeypatch), [], chat_module.Conversation.reply
    monkeypatch.setattr(
        chat_module.Conversation, "reply", lambda *a: replies.append(real_reply(*a)) or replies[-1]
    )
    code, out, err = chat(capsys, monkeypatch, chat_llama, TURNS, "--max_new_tokens", "8")
    assert code == 0, err
    tokenizer = cli.load(chat_llama).tokenizer
    first = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": TURNS[0]}]), add_bos=False)
    assert calls[0] == first  # the first turn prefills the whole rendered prompt
    second_at = next(i for i, ids in enumerate(calls) if i > 0 and len(ids) > 1)
    cached = [t for ids in calls[:second_at] for t in ids]  # what the cache holds after the first reply
    messages = [{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": replies[0]}]
    full = tokenizer.encode(tokenizer.render_chat([*messages, {"role": "user", "content": TURNS[1]}]), False)
    shared = common_prefix(cached, full)
    assert shared >= len(first) and calls[second_at] == full[shared:]  # only the new tokens
    assert len(turn_prefills(calls)) == 2 and len(out.strip().splitlines()) >= 1


def test_cache_overflow_re_encodes_in_one_line(chat_llama, capsys, monkeypatch):
    long_turn = " ".join(["the cat sat on the mat"] * 30)  # over the 128-token context
    code, _, err = chat(capsys, monkeypatch, chat_llama, [long_turn], "--max_new_tokens", "4")
    assert code == 0 and "no longer fits the 128-token context" in err, err


def test_a_model_without_chat_template_refuses_chat(chat_llama, capsys, monkeypatch):
    config = json.loads((chat_llama / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (chat_llama / "tokenizer_config.json").write_text(json.dumps(config))
    (chat_llama / "chat_template.jinja").unlink(missing_ok=True)
    code, out, err = chat(capsys, monkeypatch, chat_llama, TURNS)
    assert code == 2 and out == "" and err.count("\n") == 1 and "no chat template" in err, err


@pytest.mark.parametrize("flag", [["--prompt", "x"], ["--num_samples", "2"], ["--compile"]])
def test_flags_chat_cannot_honour_are_one_line(chat_llama, capsys, monkeypatch, flag):
    code, out, err = chat(capsys, monkeypatch, chat_llama, TURNS, *flag)
    assert code == 2 and out == "" and err.count("\n") == 1 and flag[0] in err, err


def test_a_reply_cut_by_max_new_tokens_ends_with_a_note_and_stays_as_cut(chat_llama, capsys, monkeypatch):
    replies, real_reply = [], chat_module.Conversation.reply
    monkeypatch.setattr(
        chat_module.Conversation,
        "reply",
        lambda self, *a: replies.append((real_reply(self, *a), self)) or replies[-1][0],
    )
    code, _, err = chat(
        capsys, monkeypatch, chat_llama, TURNS[:1], "--max_new_tokens", "3", "--temperature", "0"
    )
    assert code == 0 and "the reply reached the 3-token limit before the model ended its turn" in err, err
    text, conversation = replies[0]
    assert conversation.messages[-1] == {"role": "assistant", "content": text}  # kept, as the note says


def test_piped_chat_output_marks_each_turn(chat_llama, capsys, monkeypatch):
    code, out, err = chat(capsys, monkeypatch, chat_llama, TURNS, "--max_new_tokens", "3")
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("> ")] == [f"> {turn}" for turn in TURNS]


def test_a_reply_ending_in_a_partial_character_is_printed_whole(chat_llama, capsys, monkeypatch):
    from tests.generation.test_generate_ux import forcing_token, lead_byte

    forcing_token(monkeypatch, lead_byte)
    code, out, err = chat(capsys, monkeypatch, chat_llama, ["hi"], "--max_new_tokens", "2")
    tokenizer = cli.load(str(chat_llama)).tokenizer
    assert code == 0, err
    assert out == "> hi\n" + tokenizer.decode([lead_byte(tokenizer)] * 2) + "\n" and "\ufffd" in out, out


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])
def test_a_turn_that_is_not_utf8_is_one_line(chat_llama, capsys, monkeypatch, errors):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfehi\n"), "utf-8", errors))
    code, out, err = run_generate(capsys, "--checkpoint", str(chat_llama), "--chat", "--max_new_tokens", "2")
    errors = [line for line in err.splitlines() if not line.startswith("note:")]  # the model's sampling note
    assert code == 2 and out == "" and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: a --chat turn on stdin is not UTF-8 text (byte 0xff"), err
