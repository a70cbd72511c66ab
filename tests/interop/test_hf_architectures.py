"""Every architecture we load computes transformers' logits and greedy tokens, exports back with parity, and
writes the matching GGUF; every one we cannot represent is refused in one line naming its config.json key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from generation.sampling import GREEDY, generate
from interop import load_hf
from interop.export_gguf import export_gguf, llama3_freq_factors
from interop.export_hf import export_hf

SHAPE = dict(
    vocab_size=320,  # the size of the conftest tokenizer, so the exports can carry it
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# original_max_position_embeddings 32 puts this tiny head's wavelengths on both sides of the llama3 blend.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
ARCHITECTURES = {
    "llama": ("LlamaConfig", {"rope_theta": 500.0}),
    "llama3-rope": (
        "LlamaConfig",
        {"rope_parameters": LLAMA3 | {"rope_theta": 500.0, "original_max_position_embeddings": 32}},
    ),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True, "rms_norm_eps": 1e-5}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 24}),  # head_dim apart from hidden / heads = 16, as in Qwen3
}
EXPORTED_AS = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def lively(hf_model) -> None:
    """Random weights large enough that greedy decoding does not repeat one token; every norm and bias random,
    so a dropped bias, a skipped norm or a swapped tensor changes the logits."""
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.3 if name.endswith("bias") else 0.12)


def save_tiny(name: str, folder: Path):
    """A tiny random transformers model of architecture `name`, saved to `folder`; returns it."""
    transformers = pytest.importorskip("transformers")
    config_class, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_class)(**SHAPE, **extra)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    lively(hf)
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module", params=ARCHITECTURES, ids=list(ARCHITECTURES))
def hf_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    return request.param, save_tiny(request.param, folder), folder


def prompt_ids() -> torch.Tensor:
    return torch.randint(320, (2, 40), generator=torch.Generator().manual_seed(1))


def test_logits_and_greedy_tokens_equal_transformers(hf_folder):
    name, hf, folder = hf_folder
    model = load_hf(folder)
    idx = prompt_ids()
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.std() > 0.5  # far from uniform: the comparison is not trivially small
    assert (ours - theirs).abs().max().item() <= 1e-4, name
    prompt = idx[:1, :8]
    greedy = generate(model, prompt, 24, sampler=GREEDY)
    with torch.no_grad():
        expected = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24
        )
    assert greedy[0, 8:].unique().numel() >= 6, "degenerate model: greedy repeats itself"
    assert torch.equal(greedy, expected), name


def test_config_options_follow_the_architecture(hf_folder):
    name, _, folder = hf_folder
    config = load_hf(folder).config
    assert config.qkv_bias == (name == "qwen2")
    assert config.qk_norm == (name == "qwen3")
    assert config.head_dim == (24 if name == "qwen3" else 16)
    assert config.rope_type == ("llama3" if name == "llama3-rope" else "default")
    assert config.tie_embeddings == (name == "llama-tied")


def test_export_back_to_transformers_keeps_the_logits(hf_folder, tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    name, _, folder = hf_folder
    model = load_hf(folder)
    out = export_hf(model, tokenizer, tmp_path / "export")
    again, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}  # no weight left random or unused
    assert type(again).__name__ == EXPORTED_AS.get(name, "LlamaForCausalLM")
    idx = prompt_ids()
    with torch.no_grad():
        assert (model(idx) - again.eval()(idx).logits).abs().max().item() <= 1e-4
    assert load_hf(out).config == model.config


def test_gguf_export_writes_the_matching_llama_cpp_architecture(hf_folder, tokenizer, tmp_path):
    gguf = pytest.importorskip("gguf")
    name, hf, folder = hf_folder
    model = load_hf(folder)
    path = export_gguf(model, tokenizer, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(path)
    fields = {key: field.contents() for key, field in reader.fields.items()}
    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    arch = {"qwen2": "qwen2", "qwen3": "qwen3"}.get(name, "llama")
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.attention.key_length"] == model.config.head_dim
    layer0 = model.blocks[0].attn
    if name == "qwen2":
        assert torch.equal(tensors["blk.0.attn_k.bias"], layer0.qkv.bias[64:96].detach())
    if name == "qwen3":
        assert torch.equal(tensors["blk.0.attn_q_norm.weight"], layer0.q_norm.weight.detach())
        # llama.cpp's qwen3 rotates halves as we do: q rows map over unpermuted.
        assert torch.equal(
            tensors["blk.0.attn_q.weight"].flatten(), layer0.qkv.weight[:96].detach().flatten()
        )
    if name == "llama3-rope":
        # rope_freqs divides each plain frequency: it must turn ours into transformers' llama3 frequencies.
        plain = 1.0 / 500.0 ** (torch.arange(0, 16, 2).float() / 16)
        theirs = hf.model.rotary_emb.inv_freq
        assert torch.allclose(plain / tensors["rope_freqs.weight"], theirs, rtol=1e-6, atol=0)
        assert not torch.allclose(plain, theirs)  # the scaling changes some frequencies
        assert torch.equal(tensors["rope_freqs.weight"], llama3_freq_factors(model.config))
    else:
        assert "rope_freqs.weight" not in tensors


def write_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    return folder


REFUSED = {
    "gemma": ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "model_type='gemma'"),
    "gpt2": ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type='gpt2'"),
    "classifier": ({"architectures": ["LlamaForSequenceClassification"]}, "architectures="),
    "mistral-window": (
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096},
        "sliding_window=4096",
    ),
    "qwen-window": (
        {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True},
        "use_sliding_window=True",
    ),
    "layer-types": ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types="),
    "yarn": (
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
        "rope_parameters=",
    ),
    "linear-rope": ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling="),
    "partial-rotary": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
        "rope_parameters=",
    ),
    "gelu": ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act='gelu_pytorch_tanh'"),
    "mlp-bias": ({"mlp_bias": True}, "mlp_bias=True"),
    "o-bias": (
        {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": True},
        "attention_bias=True",
    ),
    "odd-head-dim": ({"head_dim": 15}, "head_dim=15"),
}


@pytest.mark.parametrize(("changes", "named"), REFUSED.values(), ids=list(REFUSED))
def test_unsupported_architecture_is_one_line_naming_the_key(tmp_path, changes, named):
    folder = tmp_path / "hf"
    save_tiny("llama", folder)
    with pytest.raises(UserError) as err:
        load_hf(write_config(folder, **changes))
    message = str(err.value)
    assert "\n" not in message and named in message, message
    assert "supported" in message or "only" in message, message
