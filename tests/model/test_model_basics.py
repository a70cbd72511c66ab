"""Config validation, initial loss, learning, and the dependency rule of model/."""

import ast
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.gpt import RMSNorm

MODEL_DIR = Path(__file__).resolve().parents[2] / "model"


@pytest.mark.parametrize(
    ("kwargs", "fields"),
    [
        ({"n_embd": 100, "n_head": 8}, ["n_embd", "n_head"]),
        ({"n_head": 8, "n_kv_head": 3}, ["n_head", "n_kv_head"]),
        ({"n_layer": 0}, ["n_layer"]),
        ({"vocab_size": 0}, ["vocab_size"]),
        ({"n_embd": 24, "n_head": 8, "n_kv_head": 1}, ["n_embd", "n_head"]),  # head_dim 3 is odd
    ],
)
def test_bad_config_is_one_line_naming_the_fields(kwargs, fields):
    with pytest.raises(ValueError) as err:
        ModelConfig(**kwargs)
    message = str(err.value)
    assert "\n" not in message
    assert all(field in message for field in fields)


def test_derived_sizes():
    config = ModelConfig(n_embd=256, n_head=8, n_kv_head=2)
    assert (config.head_dim, config.hidden_dim) == (32, 704)
    assert ModelConfig(mlp_hidden=100).hidden_dim == 100


def test_tied_embeddings_share_one_tensor():
    model = GPT(ModelConfig(vocab_size=64, n_embd=32, n_head=4, n_kv_head=2, n_layer=1))
    assert model.lm_head.weight is model.wte.weight
    untied = GPT(
        ModelConfig(vocab_size=64, n_embd=32, n_head=4, n_kv_head=2, n_layer=1, tie_embeddings=False)
    )
    assert untied.num_params() == model.num_params() + 64 * 32


def test_rms_norm_scales_by_the_reciprocal_rms_in_every_dtype():
    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 48) * 4
    x64, w64 = x.double(), norm.weight.double()
    expected = w64 * x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    assert torch.allclose(norm(x).double(), expected, rtol=1e-6, atol=0)
    assert torch.equal(norm(x), norm.weight * F.rms_norm(x, (48,), eps=1e-5))  # the one-call path's claim
    # bf16: normalised in float32, rounded to bf16, then scaled by the bf16 gain (Hugging Face Llama's order).
    norm_bf16 = norm.to(torch.bfloat16)
    x_bf16 = x.bfloat16()
    hf_order = (
        norm_bf16.weight
        * (x_bf16.float() / (x_bf16.float().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).bfloat16()
    )
    assert norm_bf16(x_bf16).dtype == torch.bfloat16
    assert torch.equal(norm_bf16(x_bf16), hf_order)


def test_initial_loss_is_near_log_vocab():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128))
    idx = torch.randint(0, 512, (8, 64))
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, dims=1).flatten())
    assert abs(loss.item() - math.log(512)) < 0.1


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64))
    idx = torch.randint(0, 64, (4, 33))
    x, y = idx[:, :-1], idx[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_model_package_imports_only_torch_and_stdlib():
    # Reading and writing other formats (safetensors, gguf, huggingface_hub) lives in interop/.
    allowed = {"torch", "common", "__future__"} | set(sys.stdlib_module_names)
    offenders = []
    for path in MODEL_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            offenders += [f"{path.name}: {root}" for root in roots if root not in allowed]
    assert offenders == []
