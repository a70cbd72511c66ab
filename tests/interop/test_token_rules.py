"""Our BPE has one BOS/EOS rule everywhere: `<|endoftext|>` ends a text, there is no BOS, none is added.

The tokenizer states it (data/tokenizer.py), and the Hugging Face and GGUF exports carry it unchanged.
"""

from __future__ import annotations

import json

import pytest

from data.tokenizer import TokenRules
from interop import load, read_tokenizer
from interop.export_gguf import export_gguf
from interop.export_hf import export_hf


def test_our_bpe_has_eos_and_no_bos(tokenizer):
    assert tokenizer.rules == TokenRules((tokenizer.eos_id,))
    assert tokenizer.token_text(tokenizer.eos_id) == "<|endoftext|>"
    assert tokenizer.bos_id is None and not tokenizer.add_bos


def test_the_hf_export_keeps_the_rule(make_model, tokenizer, tmp_path):
    out = export_hf(make_model(), tokenizer, tmp_path / "hf")
    assert read_tokenizer(out).rules == tokenizer.rules
    config = json.loads((out / "config.json").read_text())
    assert config["bos_token_id"] is None and config["eos_token_id"] == tokenizer.eos_id


def test_the_gguf_export_keeps_the_rule(make_model, tokenizer, tmp_path):
    pytest.importorskip("gguf")
    loaded = load(export_gguf(make_model(), tokenizer, tmp_path / "m.gguf"))
    assert loaded.tokenizer.rules == tokenizer.rules
