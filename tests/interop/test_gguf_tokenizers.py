"""A pretrained model's own tokenizer goes to GGUF under the pre-tokenizer name llama.cpp knows it by
(interop/pre_tokenizers.py), with its special tokens, BOS/EOS rule and chat template; llama.cpp then tokenizes and
greedy-decodes as we do. The tokenizers are tiny BPEs trained here with each model family's tokenizer.json
pipeline (SmolLM2's digits, Qwen2's and Llama 3's split regexes), read from Hugging Face folders as a real one is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as BackendTokenizer

from common.errors import UserError
from data.tokenizer import Tokenizer
from generation.sampling import GREEDY, generate
from interop import load
from interop import pre_tokenizers as table
from interop.export_gguf import export_gguf
from interop.tokenizer_files import GGUF_CONTROL, tokenizer_from_hf_folder
from tests.interop.test_gguf_llamacpp import (  # noqa: F401 (the probe fixture)
    MIXED_TEXT,
    SHAKESPEARE,
    llamacpp_greedy,
    llamacpp_tokenize,
    probe,
)
from tests.tiny_models import training_texts

gguf = pytest.importorskip("gguf", reason='the GGUF export needs pip install -e ".[gguf]"')
VOCAB = 600
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT = [
    {"role": "system", "content": "You answer in   three words."},
    {"role": "user", "content": "What's 12+345? Don't WE'LL say 3.14159…"},
    {"role": "assistant", "content": "It is 357.\n\nNext?"},
    {"role": "user", "content": "naïve café, 日本語 🙂\ttab"},
]
# Digits in runs (Llama 3 takes three at a time, Qwen2 and SmolLM2 one), contractions in any case, spaces and
# newlines in runs, non-Latin letters, a number that is not a digit (Ⅻ, ²), and each special token.
VARIED = [
    "In 2026, 1234567 people paid $3,141.59 (or ²⁄₃ Ⅻ) — that's 42% more!",
    "I'M sure THEY'RE right; it's you'Ve we'd...\n\n\n   indented    spaces \t\ttabs\r\nend  ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "Ελληνικά, русский, العربية, 中文：「引号」 🙂🚀👍🏽 naïve héllo wörld",
]


# Each family's tokenizer.json pipeline as the family ships it: (normalizer, pre_tokenizer, ignore_merges),
# plus its special tokens and rules (token, add_bos).
FAMILIES = {
    "smollm": (
        None,
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)],
        False,
        {"bos": "<|im_start|>", "eos": "<|im_end|>", "add_bos": False},
    ),
    "qwen2": (
        normalizers.NFC(),
        [
            pre_tokenizers.Split(Regex(table.QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ],
        False,
        {"bos": None, "eos": "<|im_end|>", "add_bos": False},
    ),
    "llama-bpe": (
        None,
        [
            pre_tokenizers.Split(Regex(table.LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ],
        True,
        {"bos": "<|begin_of_text|>", "eos": "<|im_end|>", "add_bos": True},
    ),
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]


def family_backend(name: str) -> BackendTokenizer:
    """A BPE with the family's pipeline, its merges learnt on Shakespeare, numbers and multilingual lines.

    The merges are learnt under GPT-2's split, which keeps digit runs and a space before them whole, so the
    vocabulary holds merges ("20", " 1") that each family's own split allows or forbids: a file declaring
    another family's split then gives other ids.
    """
    normalizer, steps, ignore_merges = FAMILIES[name][:3]
    backend = BackendTokenizer(models.BPE())
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = SHAKESPEARE.read_text(encoding="utf-8")[:100_000]
    numbers = [f"Year {1000 + 7 * i}, page {13 * i} of {i * i}, {i}.{i % 10}%" for i in range(400)]
    texts = [text[i : i + 2000] for i in range(0, len(text), 2000)] + training_texts() + numbers + VARIED
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    spec = json.loads(backend.to_str())
    spec["model"]["ignore_merges"] = ignore_merges
    return BackendTokenizer.from_str(json.dumps(spec))


def save_folder(name: str, folder: Path) -> Path:
    """A Hugging Face folder's tokenizer files for the family `name`."""
    folder.mkdir()
    family_backend(name).save(str(folder / "tokenizer.json"))
    rules = FAMILIES[name][3]
    config = {"bos_token": rules["bos"], "eos_token": rules["eos"], "add_bos_token": rules["add_bos"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHATML}))
    (folder / "generation_config.json").write_text("{}")
    return folder


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Tokenizer]:
    folder = save_folder(request.param, tmp_path_factory.mktemp(request.param) / "tok")
    return request.param, tokenizer_from_hf_folder(folder)


def texts(tokenizer: Tokenizer) -> list[str]:
    chat = tokenizer.render_chat(CHAT, add_generation_prompt=True)
    return [*VARIED, chat, MIXED_TEXT, "".join(VARIED)]


def fields(path: Path) -> dict:
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


def test_each_form_in_the_table_is_named_back_from_the_pipeline_it_builds():
    for name, form in table.PRE_TOKENIZERS.items():
        backend = BackendTokenizer(models.BPE(ignore_merges=form.ignore_merges))
        backend.pre_tokenizer, normalizer = table.build(form)
        if normalizer is not None:
            backend.normalizer = normalizer
        assert table.llamacpp_name(json.loads(backend.to_str()), "t") == name


def test_the_file_declares_the_family_and_keeps_its_rules(family, make_model, tmp_path):
    name, tokenizer = family
    path = export_gguf(make_model(vocab_size=VOCAB), tokenizer, tmp_path / "m.gguf")
    meta = fields(path)
    assert meta["tokenizer.ggml.pre"] == name and meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.eos_token_id"] == tokenizer.eos_id == tokenizer.encode("<|im_end|>", False)[0]
    assert meta.get("tokenizer.ggml.bos_token_id") == tokenizer.bos_id
    assert meta["tokenizer.ggml.add_bos_token"] == tokenizer.add_bos == FAMILIES[name][3]["add_bos"]
    assert meta["tokenizer.chat_template"] == CHATML
    types = meta["tokenizer.ggml.token_type"]
    assert [types[tokenizer.encode(token, False)[0]] for token in SPECIALS] == [GGUF_CONTROL] * 4
    # Our reader of the file builds the same tokenizer back, rules and normalizer included (a decomposed
    # accent is composed first under Qwen2's NFC; llama.cpp, which never normalizes, differs on such text).
    back = load(path).tokenizer
    assert back.rules == tokenizer.rules
    for text in [*texts(tokenizer), "cafe\u0301 ni\u0303no"]:
        assert back.encode(text) == tokenizer.encode(text), repr(text)


def test_llamacpp_tokenizes_the_family_as_we_do(probe, family, make_model, tmp_path):  # noqa: F811
    name, tokenizer = family
    path = export_gguf(make_model(vocab_size=VOCAB), tokenizer, tmp_path / "m.gguf")
    pieces = BackendTokenizer.from_str(tokenizer.backend_json).pre_tokenizer.pre_tokenize_str("1234567")
    assert len(pieces) == (3 if name == "llama-bpe" else 7)  # the family's own digit split is in play
    for text in texts(tokenizer):
        for piece in [text, *text.splitlines(keepends=True)]:
            assert llamacpp_tokenize(probe, path, piece) == tokenizer.encode(piece, add_bos=False), repr(
                piece
            )


def test_llamacpp_greedy_ids_are_ours(probe, family, make_model, tmp_path):  # noqa: F811
    name, tokenizer = family
    model = make_model(vocab_size=VOCAB, n_kv_head=2, seed=3)
    with torch.no_grad():  # livelier weights: greedy decoding wanders instead of repeating one token
        for param_name, param in model.named_parameters():
            if not param_name.endswith("norm.weight"):
                param.mul_(2.0)
    path = export_gguf(model, tokenizer, tmp_path / "m.gguf")
    prompt = tokenizer.encode(tokenizer.render_chat(CHAT[:2]), add_bos=tokenizer.add_bos)
    n_new = 32
    with torch.no_grad():
        sequence = generate(model, torch.tensor([prompt]), n_new, sampler=GREEDY)
        top2 = model(sequence)[0, len(prompt) - 1 : -1].topk(2).values
    ours = sequence[0, len(prompt) :].tolist()
    assert len(set(ours)) >= 12
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # no near-tie that float rounding could flip
    assert llamacpp_greedy(probe, path, prompt, n_new) == ours


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda s: s["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Punctuation", "behavior": "Isolated"}),
         "pre_tokenizer step Punctuation"),
        (lambda s: s["pre_tokenizer"]["pretokenizers"][0].update(individual_digits=False), "pre_tokenizer step Digits"),
        (lambda s: s["pre_tokenizer"]["pretokenizers"][-1].update(use_regex=False), "splits as none of"),
        (lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer is NFKC"),
        (lambda s: s["model"].update(ignore_merges=True), "model.ignore_merges"),
        (lambda s: s["added_tokens"][1].update(lstrip=True), "'<|im_start|>' lstrip"),
    ],
    ids=["unknown-step", "digit-runs", "no-split", "normalizer", "ignore-merges", "lstrip"],
)  # fmt: skip
def test_a_tokenizer_llamacpp_would_not_reproduce_is_one_line_naming_it(make_model, tmp_path, edit, words):
    spec = json.loads(family_backend("smollm").to_str())
    edit(spec)
    tokenizer = Tokenizer(BackendTokenizer.from_str(json.dumps(spec)), None)
    with pytest.raises(UserError, match=words) as error:
        export_gguf(make_model(vocab_size=VOCAB), tokenizer, tmp_path / "m.gguf", tokenizer_name="tok.json")
    assert str(error.value).startswith("tok.json: ") and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []
