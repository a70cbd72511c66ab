"""Hugging Face folders and Hub ids load through interop with transformers' logits and the model's own tokenizer."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from common.errors import UserError
from data.tokenizer import Tokenizer
from interop import PretrainedError, load, read_tokenizer
from tests.conftest import ROOT, TEST_ENV
from tests.interop.conftest import STOP_IDS, save_llama

TEXTS = [
    "the cat sat on the mat",
    "héllo wörld, naïve 日本語",
    "unseen bytes: ß 漢字 🚀",
    "  two  spaces\tand\nlines",
]
CHAT = [
    {"role": "user", "content": "Hello there "},
    {"role": "assistant", "content": "General Kenobi."},
    {"role": "user", "content": "ça va? 🙂"},
]


def assert_same_logits(ours, theirs) -> None:
    idx = torch.randint(ours.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_logits, their_logits = ours(idx), theirs(idx).logits
    assert their_logits.std() > 0.5  # far from uniform, so a small difference is not trivially small
    assert (ours_logits - their_logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_folder_gives_transformers_logits(transformers, tmp_path, shard, tie):
    hf = save_llama(transformers, tmp_path, shard=shard, tie=tie)
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    loaded = load(tmp_path)
    assert loaded.source.kind == "hf_folder"
    assert loaded.model.config.n_kv_head == 2 and loaded.model.config.tie_embeddings == tie
    assert_same_logits(loaded.model, hf)


def test_tokenizer_follows_the_folders_rules(transformers, llama_folder):
    _, folder = llama_folder
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = read_tokenizer(folder)
    assert ours.add_bos and ours.bos_id == 1
    assert ours.eos_ids == tuple(STOP_IDS) and ours.eos_id == 2  # </s> separates documents, both stop
    for text in TEXTS:
        assert ours.encode(text) == theirs(text).input_ids, text
        assert ours.encode(text, add_bos=False) == theirs(text, add_special_tokens=False).input_ids
        ids = ours.encode(text)
        assert ours.decode(ids) == theirs.decode(ids)  # Llama strips one leading space, as transformers does
    assert ours.encode_batch(TEXTS) == [ours.encode(text) for text in TEXTS]
    for prompt in (True, False):
        expected = theirs.apply_chat_template(
            CHAT[: 2 + prompt], tokenize=False, add_generation_prompt=prompt
        )
        assert ours.render_chat(CHAT[: 2 + prompt], add_generation_prompt=prompt) == expected
    with pytest.raises(UserError, match="roles must alternate"):
        ours.render_chat(CHAT[1:])


def test_token_bytes_of_a_byte_fallback_vocabulary(llama_folder):
    tokenizer = read_tokenizer(llama_folder[1])
    table = tokenizer.token_bytes()
    for text in TEXTS:
        ids = tokenizer.encode(text, add_bos=False)
        # Metaspace puts a space before a first word that has none, which decoding strips again.
        spaced = text if text.startswith(" ") else " " + text
        assert b"".join(table[i] for i in ids) == spaced.encode("utf-8")


def test_rules_travel_with_the_json_and_the_hash(llama_folder):
    tokenizer = read_tokenizer(llama_folder[1])
    again = Tokenizer.from_json(tokenizer.to_json())
    assert again.rules == tokenizer.rules and again.sha256 == tokenizer.sha256
    assert pickle.loads(pickle.dumps(tokenizer)).rules == tokenizer.rules
    assert "</s>" in tokenizer.to_json()
    fewer_stops = Tokenizer(again._backend, type(tokenizer.rules)(eos_ids=(2,), bos_id=1, add_bos=True))
    assert fewer_stops.sha256 != tokenizer.sha256, "rules decide the ids, so they are part of the hash"


def hub_cache(root, folder, repo_id: str = "tiny-org/tiny-llama", sha: str = "a" * 40):
    """A Hugging Face cache holding `folder` as `repo_id` at main, laid out as huggingface_hub writes it."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    return repo / "snapshots" / sha


@pytest.fixture
def offline_cache(tmp_path, llama_folder, monkeypatch):
    from huggingface_hub import constants

    snapshot = hub_cache(tmp_path / "hub", llama_folder[1])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read once, at import
    assert constants.HF_HUB_OFFLINE
    return snapshot


def test_hub_id_resolves_offline_from_the_cache(llama_folder, offline_cache):
    hf, _ = llama_folder
    for revision in (None, "a" * 40):
        loaded = load("tiny-org/tiny-llama", revision=revision)
        assert loaded.source.kind == "hub" and loaded.source.path == offline_cache
        assert_same_logits(loaded.model, hf)
    assert loaded.tokenizer.eos_ids == tuple(STOP_IDS)


def test_hub_cache_comes_from_the_environment(llama_folder, tmp_path):
    snapshot = hub_cache(tmp_path / "hub", llama_folder[1])
    env = {**os.environ, **TEST_ENV, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    code = "from interop import resolve; print(resolve('tiny-org/tiny-llama').path)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(snapshot)


def test_missing_hub_id_offline_is_one_line(offline_cache):
    with pytest.raises(PretrainedError) as error:
        load("nobody/missing-model")
    message = str(error.value)
    assert "\n" not in message and "nobody/missing-model" in message and "HF_HUB_OFFLINE" in message


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("", "model name is empty"),
        ("no/such/path.ckpt", "no such file or folder"),
        ("runs/nothing-here.ckpt", "no such file or folder"),
    ],
)
def test_bad_names_are_one_line(name, match):
    with pytest.raises(PretrainedError, match=match) as error:
        load(name)
    assert "\n" not in str(error.value)


def test_a_revision_needs_a_hub_id(llama_folder):
    with pytest.raises(PretrainedError, match="Hub ids only"):
        load(llama_folder[1], revision="main")


def test_a_folder_without_safetensors_is_refused(llama_folder, tmp_path):
    shutil.copytree(llama_folder[1], tmp_path / "pickles")
    (tmp_path / "pickles" / "model.safetensors").rename(tmp_path / "pickles" / "pytorch_model.bin")
    with pytest.raises(PretrainedError, match="safetensors") as error:
        load(tmp_path / "pickles")
    assert str(tmp_path / "pickles") in str(error.value)
