"""The one tensor-name table: a row added or renamed in interop/names.py is what every format reads and writes."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from interop import load, load_hf, names
from interop.export_gguf import export_gguf
from interop.export_hf import export_hf
from interop.names import Part

gguf = pytest.importorskip("gguf")


@pytest.fixture
def renamed(monkeypatch):
    """The block's attention norm under names no format uses, changed in the table alone."""
    part = Part("model.layers.{i}.fake_attn_norm.weight", "blk.{i}.fake_attn_norm.weight")
    monkeypatch.setitem(names.TABLE, "blocks.{i}.attn_norm.weight", (part,))


def assert_same_weights(a, b) -> None:
    assert a.config == b.config
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["llama", "qwen2"])
def test_a_renamed_row_is_written_and_read_by_the_hf_folder(
    renamed, make_model, tokenizer, tmp_path, qkv_bias
):
    model = make_model(qkv_bias=qkv_bias)
    out = export_hf(model, tokenizer, tmp_path / "hf")
    with safe_open(out / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    assert "model.layers.1.fake_attn_norm.weight" in stored
    assert "model.layers.1.input_layernorm.weight" not in stored
    assert_same_weights(model, load_hf(out))


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_a_renamed_row_is_written_and_read_by_gguf(renamed, make_model, tokenizer, tmp_path, qk_norm):
    model = make_model(qk_norm=qk_norm)
    path = export_gguf(model, tokenizer, tmp_path / "m.gguf")
    stored = {tensor.name for tensor in gguf.GGUFReader(path).tensors}
    assert "blk.1.fake_attn_norm.weight" in stored and "blk.1.attn_norm.weight" not in stored
    assert_same_weights(model, load(path).model)


def test_the_table_covers_every_tensor_of_every_option(make_model):
    """Each option's tensors have a row, and the table's names for them are all different."""
    for options in ({}, {"qkv_bias": True}, {"qk_norm": True}, {"tie": False}):
        model = make_model(**options)
        for fmt in ("hf", "gguf"):
            stored = names.to_format(model.state_dict(), model.config, fmt)
            expected = sum(p.numel() for p in model.parameters())
            assert sum(t.numel() for t in stored.values()) == expected, (options, fmt)
