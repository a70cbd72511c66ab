"""LoRA adapters: at zero they change nothing, only they learn, merging them computes the same, the compiled model
gives the eager loss and gradients, each fused part has its own pair, and a step through kept blocks (QLoRA) is the step through
their float weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from common.errors import UserError
from model import GPT, ModelConfig
from model.lora import LoRAConfig, LoRALinear, adapter_state, adapters, add_lora, merge_lora
from tests.cpu_kernels.test_row_kernel import random_layer

CONFIG = ModelConfig(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)


def model_and_ids(seed: int = 0) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(seed)
    return GPT(CONFIG).eval(), torch.randint(0, CONFIG.vocab_size, (2, 12))


def trained_adapters(model: GPT, seed: int = 1) -> GPT:
    """Give every B a random value, as training would: B starts at zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for adapter in adapters(model).values():
            adapter.lora_b.copy_(torch.randn(adapter.lora_b.shape, generator=generator) * 0.05)
    return model


def test_adapters_at_zero_change_nothing():
    model, ids = model_and_ids()
    before = model(ids)
    add_lora(model, LoRAConfig(rank=4, dropout=0.0))
    assert len(adapters(model)) == 4 * CONFIG.n_layer
    assert torch.equal(model(ids), before)


def test_only_the_adapters_learn():
    model, ids = model_and_ids()
    add_lora(model.train(), LoRAConfig(rank=4, dropout=0.1, targets=("qkv", "down")))
    trained_adapters(model)  # B zero would leave A without gradient
    F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    learning = {name for name, p in model.named_parameters() if p.grad is not None}
    assert learning == {name for name, p in model.named_parameters() if p.requires_grad}
    assert learning == set(adapter_state(model)) and len(learning) == 2 * 2 * CONFIG.n_layer
    assert all(model.get_parameter(name).grad.abs().sum() > 0 for name in learning)


def test_the_merged_model_computes_base_plus_adapters():
    model, ids = model_and_ids()
    trained_adapters(add_lora(model, LoRAConfig(rank=4, dropout=0.0)))
    adapted = model(ids)
    merged = merge_lora(copy.deepcopy(model))
    assert not adapters(merged) and set(merged.state_dict()) == set(GPT(CONFIG).state_dict())
    torch.testing.assert_close(merged(ids), adapted, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(adapted, model_and_ids()[0](ids), atol=1e-3)  # the adapters did change it


def adapter_gradients(model: GPT, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


def test_compiled_lora_gives_the_eager_loss_and_gradients():
    """`model.compile` with adapters (training/lit_gpt.py compiles the model after adding them): inductor's
    forward and backward give the eager loss and adapter gradients (dropout 0: inductor draws its own masks).
    Gradients, not AdamW steps: Adam divides each by its own size, so float noise in a near-zero one moves its
    weight by the whole learning rate."""
    model, ids = model_and_ids()
    trained_adapters(add_lora(model.train(), LoRAConfig(rank=4, dropout=0.0)))  # B zero gives A no gradient
    compiled = copy.deepcopy(model)
    compiled.compile()
    (loss, eager), (compiled_loss, steps) = adapter_gradients(model, ids), adapter_gradients(compiled, ids)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-6, atol=0)
    assert set(steps) == set(eager) == set(adapter_state(model))
    for name, grad in eager.items():
        assert grad.abs().max() > 1e-4, name  # every adapter learns
        torch.testing.assert_close(
            steps[name], grad, rtol=1e-4, atol=1e-4 * grad.abs().max().item(), msg=name
        )


def test_each_fused_part_has_its_own_pair():
    model, _ = model_and_ids()
    trained_adapters(add_lora(model, LoRAConfig(rank=3, alpha=6.0, dropout=0.0, targets=("qkv",))))
    qkv = model.blocks[0].attn.qkv
    assert isinstance(qkv, LoRALinear) and qkv.parts == [64, 32, 32]
    a_q, a_k, a_v = qkv.lora_a.split(3)
    b_q, b_k, b_v = qkv.lora_b.split(qkv.parts)
    expected = 2.0 * torch.cat([b_q @ a_q, b_k @ a_k, b_v @ a_v])  # alpha / rank = 2
    torch.testing.assert_close(qkv.delta(), expected)
    x = torch.randn(5, 64)
    torch.testing.assert_close(qkv(x), qkv.base(x) + x @ expected.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("field", "value"), [("rank", 0), ("alpha", 0.0), ("dropout", 1.0), ("targets", ("q",))]
)
def test_a_bad_lora_key_is_one_line_naming_it(field, value):
    with pytest.raises(UserError, match=f"model.lora_{field}"):
        LoRAConfig(**{field: value})


@pytest.mark.parametrize("group_rows", [None, 10], ids=["whole", "in-groups-of-10-rows"])
def test_a_step_through_kept_blocks_is_the_step_through_their_float_weights(monkeypatch, group_rows):
    # QLoRA: the frozen layer stays in its 4-bit blocks; its backward dequantises again instead of keeping a
    # float copy (a group of output rows at a time). The same step on nn.Linear holding the dequantised weight
    # must give the same adapters.
    import cpu_kernels.quantized

    if group_rows is not None:
        monkeypatch.setattr(cpu_kernels.quantized, "DEQUANTISED_BYTES", 4 * 128 * group_rows)
    kept = random_layer(bits=4, with_minimum=True, out=96, inp=128)
    dense = torch.nn.Linear(128, 96, bias=False)
    with torch.no_grad():
        dense.weight.copy_(kept.dequantize())
    config = LoRAConfig(rank=4, dropout=0.0)
    torch.manual_seed(0)
    on_blocks = LoRALinear(kept, [96], config)
    torch.manual_seed(0)
    on_floats = LoRALinear(dense.requires_grad_(False), [96], config)
    x = torch.randn(3, 10, 128, requires_grad=True)  # an earlier adapter's output: it carries a gradient
    for layer in (on_blocks, on_floats):
        with torch.no_grad():
            layer.lora_b.fill_(0.01)
    grads = []
    for layer in (on_blocks, on_floats):
        optimizer = torch.optim.AdamW([layer.lora_a, layer.lora_b], lr=1e-2)
        x.grad = None
        loss = layer(x).square().mean()
        loss.backward()
        optimizer.step()
        grads.append(x.grad.clone())
    torch.testing.assert_close(
        grads[0], grads[1], rtol=1e-5, atol=1e-6
    )  # the gradient the blocks passed back
    torch.testing.assert_close(on_blocks.lora_a, on_floats.lora_a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(on_blocks.lora_b, on_floats.lora_b, rtol=1e-5, atol=1e-6)
