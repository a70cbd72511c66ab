"""The checkpoint format round-trips through its one owner, and damaged metadata is one CheckpointError line."""

from __future__ import annotations

import hashlib

import pytest
import torch

from checkpoints.format import (
    FORMAT_VERSION,
    META_KEY,
    STATE_PREFIX,
    CheckpointError,
    checkpoint_metadata,
    load_checkpoint,
    read_checkpoint,
)
from common.errors import UserError
from model import GPT, ModelConfig

TOKENIZER_JSON = '{"model": "stand-in"}'  # the reader only checks it against its sha256


def save(tmp_path, model: GPT, **meta_changes) -> str:
    sha256 = hashlib.sha256(TOKENIZER_JSON.encode("utf-8")).hexdigest()
    meta = checkpoint_metadata(model.config, TOKENIZER_JSON, sha256, {"path": tmp_path, "sizes": (1, 2)})
    meta.update(meta_changes)
    state = {STATE_PREFIX + name: tensor for name, tensor in model.state_dict().items()}
    path = tmp_path / "x.ckpt"
    torch.save({"state_dict": state, META_KEY: meta}, path)
    return str(path)


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(
        ModelConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16, norm_eps=1e-6)
    )


def test_written_metadata_loads_back_with_weights_only(tmp_path):
    model = tiny_model()
    loaded = load_checkpoint(save(tmp_path, model))
    assert loaded.model.config == model.config and loaded.tokenizer_json == TOKENIZER_JSON
    assert loaded.meta["format"] == FORMAT_VERSION
    assert loaded.meta["data"] == {"path": str(tmp_path), "sizes": [1, 2]}  # plain types only
    assert all(torch.equal(t, loaded.model.state_dict()[n]) for n, t in model.state_dict().items())


@pytest.mark.parametrize(
    ("changes", "words"),
    [({"format": FORMAT_VERSION + 1}, "newer"), ({"tokenizer_sha256": "0" * 64}, "sha256")],
    ids=["newer-format", "altered-tokenizer"],
)
def test_damaged_metadata_is_one_line(tmp_path, changes, words):
    path = save(tmp_path, tiny_model(), **changes)
    with pytest.raises(CheckpointError, match=words) as caught:
        read_checkpoint(path)
    assert (
        isinstance(caught.value, UserError)
        and "\n" not in str(caught.value)
        and "x.ckpt" in str(caught.value)
    )
