"""GGUF files load back through interop: our own export with its logits and token ids, bad files in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interop import PretrainedError, load
from interop.export_gguf import export_gguf
from tests.hf.test_hf_parity import TEXTS
from tests.interop.gguf_by_hand import write_gguf

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_our_export_loads_back_with_the_same_logits(make_model, tokenizer, tmp_path, tie):
    model = make_model(n_kv_head=2, tie=tie)
    path = export_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    loaded = load(path)
    assert loaded.source.kind == "gguf" and loaded.model.config == model.config
    idx = torch.randint(model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, back = model(idx), loaded.model(idx)
    assert ours.std() > 0.5
    assert (ours - back).abs().max().item() <= 1e-4
    original = tokenizer
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == original.encode(text), text
        assert loaded.tokenizer.decode(original.encode(text)) == text
    assert loaded.tokenizer.eos_ids == (original.eos_id,) and not loaded.tokenizer.add_bos


def test_an_unsupported_tensor_type_is_one_line(make_model, tokenizer, tmp_path):
    write_gguf(
        tmp_path / "ints.gguf",
        make_model(),
        tokenizer,
        lambda name, a: (a.astype(np.int32) if name == "token_embd.weight" else a, None),
    )
    with pytest.raises(PretrainedError, match="token_embd.weight has type I32") as error:
        load(tmp_path / "ints.gguf")
    assert "\n" not in str(error.value) and "ints.gguf" in str(error.value)


def test_an_unsupported_architecture_is_one_line(make_model, tokenizer, tmp_path):
    write_gguf(tmp_path / "gemma.gguf", make_model(), tokenizer, architecture="gemma")
    with pytest.raises(PretrainedError, match="architecture 'gemma' is not supported"):
        load(tmp_path / "gemma.gguf")


def test_a_file_named_gguf_that_is_not_one(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(PretrainedError, match="not a GGUF file"):
        load(tmp_path / "fake.gguf")
