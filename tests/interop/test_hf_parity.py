"""An export loads in transformers as LlamaForCausalLM and behaves exactly like our model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from generation.sampling import GREEDY, generate
from interop.export_hf import export_hf

# (n_kv_head, tie_embeddings) with n_head = 4: MHA and GQA, tied and untied.
VARIANTS = [(4, True), (4, False), (2, True), (2, False)]
TEXTS = [
    "the cat sat on the mat",
    "héllo wörld, naïve café",
    "日本語 and Ελληνικά with 🙂 emoji",
    "  leading spaces, don't\ttabs\nnewlines",
    f"two documents<|endoftext|>joined{' '}",
    "unseen: ß ø 漢字 🚀",
]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: f"kv{v[0]}-{'tied' if v[1] else 'untied'}")
def exported(request, make_model, tokenizer, tmp_path_factory):
    n_kv_head, tie = request.param
    model = make_model(n_kv_head=n_kv_head, tie=tie, seed=n_kv_head + 10 * tie)
    out = export_hf(model, tokenizer, tmp_path_factory.mktemp("export") / "hf")
    return model, out


def load_hf(transformers, path: Path, attn: str):
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=attn, dtype=torch.float32, output_loading_info=True
    )
    # transformers fills a missing weight with random values and only logs it: make that a failure.
    assert {k: v for k, v in info.items() if v} == {}
    return hf.eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_transformers(transformers, exported, attn):
    model, out = exported
    hf = load_hf(transformers, out, attn)
    assert type(hf).__name__ == "LlamaForCausalLM"
    idx = torch.randint(model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.std() > 0.5  # logits far from uniform, so the comparison is not trivially small
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_tokenizer_gives_our_ids(transformers, exported, encode):
    _, out = exported
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = encode(text)
        assert hf_tokenizer(text)["input_ids"] == ids, text
        assert hf_tokenizer.decode(ids) == text
    assert hf_tokenizer.eos_token == "<|endoftext|>"
    assert hf_tokenizer.eos_token_id == encode("<|endoftext|>")[0]


def test_greedy_generation_matches_transformers(transformers, exported, encode):
    model, out = exported
    hf = load_hf(transformers, out, "sdpa")
    prompt = torch.tensor([encode("héllo wörld, the cat")])
    eos_id = hf.generation_config.eos_token_id
    ours = generate(model, prompt, 40, sampler=GREEDY, eos_id=eos_id)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=40
        )
    assert ours.shape[1] - prompt.shape[1] >= 32  # no early EOS, so the comparison covers 32+ tokens
    assert torch.equal(ours, theirs)
