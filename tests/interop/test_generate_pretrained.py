"""generate.py and the exports on models that are not ours: a Hugging Face folder, its GGUF, and back to HF.

Every model is a tiny random transformers `LlamaForCausalLM` with weights spread wide enough (std 0.2) that its
greedy continuation keeps changing token, so two broken paths cannot agree by both repeating one token.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer

import generate as cli
from common.errors import run_command
from tests.conftest import run_generate
from tests.interop.conftest import STOP_IDS, save_llama

PROMPT = "the cat sat on"
NEW = 24


def spy_on_generate(monkeypatch) -> dict:
    """Records the prompt and the output ids of generate.py's call to `generate`."""
    seen, real = {}, cli.generate

    def spy(model, idx, *args, **kwargs):
        seen["prompt"], seen["eos_id"] = idx[0].tolist(), kwargs.get("eos_id")
        seen["out"] = real(model, idx, *args, **kwargs)[0].tolist()
        return torch.tensor([seen["out"]])

    monkeypatch.setattr(cli, "generate", spy)
    return seen


def transformers_greedy(model, ids: list[int], stops) -> list[int]:
    """transformers' own greedy continuation of `ids`, cut after the first stop id."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=list(stops)
        )
    new = out[0, len(ids) :].tolist()
    return next((new[: i + 1] for i, t in enumerate(new) if t in stops), new)


def assert_lively(new: list[int]) -> None:
    assert len(new) >= 12 and len(set(new)) >= 8, new  # not one token repeated: the comparison can fail


@pytest.fixture
def lively_llama(transformers, tmp_path):
    folder = tmp_path / "llama"
    return save_llama(transformers, folder, shard=False, std=0.2), folder


def test_hf_folder_greedy_tokens_equal_transformers(transformers, lively_llama, capsys, monkeypatch):
    model, folder = lively_llama
    ids = transformers.AutoTokenizer.from_pretrained(folder)(PROMPT).input_ids
    assert ids[0] == 1  # the transformers tokenizer adds <s>: our prompt must too
    seen = spy_on_generate(monkeypatch)
    code, _, err = run_generate(capsys, "--checkpoint", str(folder), "--prompt", PROMPT, "--temperature", "0",
                                "--max_new_tokens", str(NEW), "--no_echo")  # fmt: skip
    assert code == 0, err
    assert seen["prompt"] == ids and tuple(seen["eos_id"]) == tuple(STOP_IDS)
    expected = transformers_greedy(model, ids, STOP_IDS)
    assert_lively(expected)
    assert seen["out"][len(ids) : len(ids) + len(expected)] == expected


def test_generation_config_makes_an_hf_model_greedy_by_default(lively_llama, capsys, monkeypatch):
    _, folder = lively_llama
    runs = [
        run_generate(capsys, "--checkpoint", str(folder), "--prompt", PROMPT, "--seed", seed) for seed in "12"
    ]
    assert runs[0][1] == runs[1][1] and "generation_config.json" in runs[0][2]  # greedy: seeds do not matter
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}))
    runs = [
        run_generate(capsys, "--checkpoint", str(folder), "--prompt", PROMPT, "--seed", seed) for seed in "12"
    ]
    assert runs[0][1] != runs[1][1]  # the model asks to sample: the seeds now differ


def test_gguf_of_an_hf_folder_greedy_tokens_equal_transformers(
    transformers, tokenizer_json, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("gguf")
    from interop import export_gguf

    folder, path = tmp_path / "bpe-llama", tmp_path / "bpe-llama.gguf"
    model = save_llama(
        transformers, folder, shard=False, std=0.2, backend=BackendTokenizer.from_str(tokenizer_json)
    )
    assert export_gguf.main(["--checkpoint", str(folder), "--out", str(path)]) == 0
    ids = transformers.AutoTokenizer.from_pretrained(folder)(PROMPT).input_ids
    seen = spy_on_generate(monkeypatch)
    code, _, err = run_generate(capsys, "--checkpoint", str(path), "--prompt", PROMPT, "--temperature", "0",
                                "--max_new_tokens", str(NEW))  # fmt: skip
    assert code == 0, err
    stops = [model.config.eos_token_id]
    expected = transformers_greedy(model, ids, stops)
    assert_lively(expected)
    assert seen["prompt"] == ids and seen["out"][len(ids) : len(ids) + len(expected)] == expected
    assert cli.load(path).tokenizer.eos_ids == tuple(stops)  # the GGUF keeps the model's EOS


def test_gguf_export_of_a_non_gpt2_vocabulary_is_one_line(lively_llama, tmp_path, capsys):
    pytest.importorskip("gguf")
    from interop import export_gguf

    _, folder = lively_llama
    out = tmp_path / "x.gguf"
    assert run_command(lambda: export_gguf.main(["--checkpoint", str(folder), "--out", str(out)])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "byte_fallback" in err and not out.exists()


def test_hf_folder_re_exported_to_hf_round_trips(transformers, lively_llama, tmp_path, capsys):
    from interop import export_hf

    model, folder = lively_llama
    out = tmp_path / "again"
    assert export_hf.main(["--checkpoint", str(folder), "--out", str(out)]) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    idx = torch.randint(300, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (again(idx).logits - model(idx).logits).abs().max().item()
    assert diff <= 1e-4
    theirs, back = (transformers.AutoTokenizer.from_pretrained(f) for f in (folder, out))
    for text in ("the cat sat on the mat", "héllo wörld 🙂 don't"):
        assert back(text).input_ids == theirs(text).input_ids  # <s> added in both
    chat = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "the cat"}]
    assert back.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == STOP_IDS and generation["bos_token_id"] == 1
    reloaded = cli.load(out).tokenizer
    assert reloaded.eos_ids == tuple(STOP_IDS) and reloaded.add_bos and reloaded.chat_template


def test_attention_pages_of_a_30_layer_9_head_model(transformers, tmp_path, capsys):
    folder = tmp_path / "deep"
    shape = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 72}
    save_llama(transformers, folder, shard=False, **shape)
    html, png = tmp_path / "a.html", tmp_path / "a.png"
    code, _, err = run_generate(capsys, "--checkpoint", str(folder), "--prompt", PROMPT, "--max_new_tokens", "4",
                                "--attention_html", str(html), "--attention_map", str(png))  # fmt: skip
    assert code == 0, err
    assert html.stat().st_size > 0 and png.stat().st_size > 0 and "layer 29" in err
    code, out, err = run_generate(capsys, "--checkpoint", str(folder), "--explain_attention", PROMPT,
                                  "--layer", "29", "--head", "8")  # fmt: skip
    assert code == 0 and out.startswith("layer 29, head 8"), err
