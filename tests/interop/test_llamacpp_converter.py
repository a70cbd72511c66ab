"""Qwen2 and Qwen3 GGUF files written by llama.cpp's own converter load with transformers' logits and token ids.

The files come from `convert_hf_to_gguf.py` of the llama.cpp sources tools/llamacpp/build.sh unpacks, run on a
tiny random Hugging Face folder. One step of it is told rather than computed: the converter names a BPE
tokenizer's pre-tokenizer by hashing the ids a fixed text gets, a hash only the real Qwen vocabulary gives, so
the test answers "qwen2" for the tiny tokenizer, whose tokenizer.json has Qwen2's split as a real Qwen folder's has.
Everything else (metadata, tensor names and layout, the vocabulary) is llama.cpp's code, unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, normalizers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.pre_tokenizers import ByteLevel, Split
from tokenizers.pre_tokenizers import Sequence as PreSequence

from data.tokenizer import Tokenizer
from interop import load
from interop.export_hf import tokenizer_config, write_json
from tests.interop.test_gguf_llamacpp import MIXED_TEXT, llamacpp_binary
from tests.interop.test_hf_architectures import save_tiny
from tools.llamacpp.binaries import where_built

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.slow

# As Qwen2's tokenizer.json spells its split (written out here, not taken from interop/pre_tokenizers.py).
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Runs the converter as its own __main__ with the pre-tokenizer lookup answered (see the module docstring).
RUN_CONVERTER = """
import runpy, sys
from pathlib import Path
converter = Path(sys.argv[1])
sys.path[:0] = [str(converter.parent), str(converter.parent / "gguf-py")]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = [str(converter), *sys.argv[2:]]
runpy.run_path(str(converter), run_name="__main__")
"""


@pytest.fixture(scope="module")
def converter() -> Path:
    llamacpp_binary("probe")  # built, so the sources are unpacked (a skip or a CI failure if not)
    path = where_built("--where-converter")
    assert path.is_file(), f"no convert_hf_to_gguf.py at {path}"
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports it for Qwen models")
    return path


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A 320-token byte-level BPE (the tiny models' vocabulary) that has learned merges of digit runs, spaces and
    newlines, where Qwen2's split and GPT-2's part ways: so reading "qwen2" as another form changes the ids."""
    return Tokenizer.train([MIXED_TEXT] * 20, 320, show_progress=False)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_a_qwen_gguf_from_llamacpps_converter_loads_with_transformers_logits(
    name, converter, tokenizer, tmp_path
):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    hf = save_tiny(name, folder)
    # A Qwen folder's tokenizer.json carries Qwen2's split and NFC, which the converter is told (see above).
    backend = BackendTokenizer.from_str(tokenizer.backend_json)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = PreSequence(
        [Split(Regex(QWEN2_SPLIT), "isolated"), ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    (folder / "tokenizer.json").write_text(backend.to_str(), encoding="utf-8")
    write_json(
        folder / "tokenizer_config.json", tokenizer_config(128, tokenizer)
    )  # its EOS, as a real folder has
    out = tmp_path / f"{name}.gguf"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_CONVERTER,
            str(converter),
            str(folder),
            "--outfile",
            str(out),
            "--outtype",
            "f32",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fields = gguf.GGUFReader(out).fields
    assert fields["general.architecture"].contents() == name
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2"

    loaded = load(out)
    idx = torch.randint(320, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = hf(idx).logits, loaded.model(idx)
    assert theirs.std() > 0.5 and (ours - theirs).abs().max().item() <= 1e-4

    # The GGUF's "qwen2" must read back as the split transformers runs on the folder.
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    expected = reference.encode(MIXED_TEXT, add_special_tokens=False)
    assert loaded.tokenizer.encode(MIXED_TEXT) == expected
    assert loaded.tokenizer.decode(expected) == reference.decode(expected)
