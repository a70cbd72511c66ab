"""llama.cpp itself loads our GGUF, tokenizes as we do and decodes our greedy tokens.

Needs the probe built by tools/llamacpp/build.sh (cached under ~/.cache). Outside CI a missing build skips
these tests with the command to run; with CI=true or GQA_REQUIRE_LLAMACPP=1 (.ci/run sets it) it fails them,
so a broken build cannot pass silently.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from data.tokenizer import EOS_TOKEN as EOS
from generation.sampling import GREEDY, generate
from interop.export_gguf import export_gguf
from tests.tiny_models import training_texts
from tools.llamacpp.binaries import llamacpp_program, not_found

pytest.importorskip("gguf", reason='the GGUF export needs pip install -e ".[gguf]"')
REPO_ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO_ROOT / "data" / "corpora" / "tinyshakespeare.txt"
VOCAB = 512
# Every kind of text a pre-tokenizer can split differently: letters after newlines, runs of spaces and tabs,
# contractions, digits, punctuation runs, emoji (4-byte UTF-8), CJK, Greek, accents, a literal special token.
MIXED_TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak!\n"
    "  indented\tand\ttabbed --- 'tis don't we'll I'M...?! (x) [y] {z} 12 345 6789 3.14\n"
    "日本語のテキスト、中文。 🙂🚀 naïve héllo wörld Ελληνικά\r\n" + EOS + "trailing   \n\n"
)


def llamacpp_binary(name: str) -> Path:
    """The llama.cpp program `name` (tools/llamacpp/binaries.py); a skip (or, with CI=true, a failure) without."""
    path = llamacpp_program(name)
    if path is None:
        if llamacpp_required():
            pytest.fail(not_found(name))
        pytest.skip(not_found(name))
    return path


def llamacpp_required() -> bool:
    """With CI=true or GQA_REQUIRE_LLAMACPP=1 (.ci/run sets it) a llama.cpp test without llama.cpp fails."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("GQA_REQUIRE_LLAMACPP") == "1"


@pytest.fixture(scope="module")
def probe() -> Path:
    """The llamacpp-probe binary."""
    return llamacpp_binary("probe")


@pytest.fixture(scope="module")
def shakespeare_tokenizer():
    """A byte-level BPE trained as data/tokenizer.py does, on Shakespeare plus multilingual lines."""
    from data.tokenizer import Tokenizer

    text = SHAKESPEARE.read_text(encoding="utf-8")[:200_000]
    return Tokenizer.train(
        [text[i : i + 2000] for i in range(0, len(text), 2000)] + training_texts(), VOCAB, show_progress=False
    )


def run_probe(probe: Path, *args: str, stdin: str) -> list[str]:
    done = subprocess.run([str(probe), *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def llamacpp_tokenize(probe: Path, gguf_path: Path, text: str) -> list[int]:
    return [int(i) for i in run_probe(probe, "tokenize", str(gguf_path), stdin=text)[0].split()]


def llamacpp_greedy(probe: Path, gguf_path: Path, prompt: list[int], n_new: int) -> list[int]:
    lines = run_probe(probe, "generate", str(gguf_path), str(n_new), "2", stdin=" ".join(map(str, prompt)))
    return [int(i) for i in lines[0].split()]


def test_llamacpp_tokenizes_mixed_text_to_our_ids(probe, shakespeare_tokenizer, make_model, tmp_path):
    path = export_gguf(make_model(vocab_size=VOCAB), shakespeare_tokenizer, tmp_path / "m.gguf")
    ours = shakespeare_tokenizer.encode(MIXED_TEXT)
    assert len(ours) > 100 and len(set(ours)) > 60  # merged words, bytes and the special token all appear
    assert shakespeare_tokenizer.eos_id in ours
    for line in [MIXED_TEXT, *MIXED_TEXT.splitlines(keepends=True)]:
        assert llamacpp_tokenize(probe, path, line) == shakespeare_tokenizer.encode(line), repr(line)


def varied_model(make_model, n_kv_head: int, tie: bool):
    """A random model whose greedy output wanders: at make_model's weight scale, greedy decoding of some
    shapes settles into repeating one token, which a broken export could reproduce by chance."""
    model = make_model(n_kv_head=n_kv_head, tie=tie, vocab_size=VOCAB)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.mul_(2.0)
    return model


@pytest.mark.parametrize(
    "n_kv_head,tie", [(4, True), (2, True), (1, False)], ids=["mha", "gqa", "mqa-untied"]
)
def test_llamacpp_greedy_decoding_gives_our_tokens(
    probe, shakespeare_tokenizer, make_model, tmp_path, n_kv_head, tie
):
    model = varied_model(make_model, n_kv_head, tie)
    path = export_gguf(model, shakespeare_tokenizer, tmp_path / "m.gguf")
    prompt = shakespeare_tokenizer.encode("First Citizen:\nBefore we proceed")
    n_new = 48
    assert len(prompt) + n_new <= model.config.block_size
    with torch.no_grad():
        sequence = generate(model, torch.tensor([prompt]), n_new, sampler=GREEDY)
        top2 = model(sequence)[0, len(prompt) - 1 : -1].topk(2).values  # the logits each choice was made from
    ours = sequence[0, len(prompt) :].tolist()
    assert len(set(ours)) >= 20  # not a repetition that a broken path could also produce
    # f32 on both sides differs by ~1e-5 in the logits; a smaller margin would make a mismatch a coin toss.
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    assert llamacpp_greedy(probe, path, prompt, n_new) == ours


def test_llamacpp_with_our_lora_adapter_gives_our_greedy_tokens(
    probe, shakespeare_tokenizer, make_model, tmp_path
):
    from interop.export_lora import write_gguf_adapter
    from model.lora import LoRAConfig, adapters, add_lora

    model = varied_model(make_model, 2, True)
    base = export_gguf(model, shakespeare_tokenizer, tmp_path / "base.gguf")
    add_lora(model, LoRAConfig(rank=4, alpha=8.0, dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # trained adapters' size: enough to change the greedy path
        for adapter in adapters(model).values():
            adapter.lora_b.copy_(torch.randn(adapter.lora_b.shape, generator=generator) * 0.05)
    lora = {"alpha": 8.0}
    adapter_file = write_gguf_adapter(model.eval(), lora, tmp_path / "adapter.gguf")
    prompt = shakespeare_tokenizer.encode("First Citizen:\nBefore we proceed")
    with torch.no_grad():
        sequence = generate(model, torch.tensor([prompt]), 32, sampler=GREEDY)
        top2 = model(sequence)[0, len(prompt) - 1 : -1].topk(2).values
    ours = sequence[0, len(prompt) :].tolist()
    assert len(set(ours)) >= 12 and (top2[:, 0] - top2[:, 1]).min() > 1e-3
    lines = run_probe(
        probe, "generate", str(base), "32", "2", str(adapter_file), stdin=" ".join(map(str, prompt))
    )
    assert [int(i) for i in lines[0].split()] == ours
    assert llamacpp_greedy(probe, base, prompt, 32) != ours  # the adapter is what llama.cpp applied
