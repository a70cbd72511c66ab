"""The memory estimate against what autograd really keeps, a hand count, the KV cache; the printed report."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import GPT, KVCache, ModelConfig
from tests.shapes import GPT2_SMALL
from training.fit_summary import fit_report
from training.memory import (
    activation_bytes,
    count_parameters,
    estimate_training_memory,
    kv_cache_bytes_per_token,
)

SMALL = ModelConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, mlp_hidden=96)


def saved_activation_bytes(model: GPT, idx: torch.Tensor, targets: torch.Tensor, autocast: bool) -> int:
    """Bytes of the distinct storages autograd saves for backward, parameters excluded."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(nbytes for ptr, nbytes in storages.items() if ptr not in params)


@pytest.mark.parametrize(("precision", "autocast"), [("32-true", False), ("bf16-mixed", True)])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_activation_estimate_is_what_autograd_saves(precision, autocast, tie):
    config = ModelConfig(**{**SMALL.to_dict(), "tie_embeddings": tie})
    batch, seq = 3, 40
    idx, targets = torch.randint(0, config.vocab_size, (2, batch, seq))
    measured = saved_activation_bytes(GPT(config), idx, targets, autocast)
    assert activation_bytes(config, batch, seq, precision) == measured - 4  # 4: the scalar loss


def test_memory_of_the_124m_config_matches_a_hand_count():
    # Parameters: 100,663,296 matmul weights (see test_flops) + 25 RMSNorm gains of 768.
    est = estimate_training_memory(GPT2_SMALL, batch_size=16, seq_len=1024, precision="bf16-mixed")
    assert est.parameters == count_parameters(GPT2_SMALL) == 100_663_296 + 25 * 768 == 100_682_496
    assert est.weight_bytes == est.grad_bytes == 4 * 100_682_496  # float32 master weights and grads
    assert est.optimizer_bytes == 8 * 100_682_496
    # Per token and layer: norms 2 * (4C + 4 + 4C + 2C) = 15,368; attention 2 * (1280 + 1024 + 768) + 4 * 12
    # = 6,192; SwiGLU 2 * 4 * 2048 = 16,384. Once: final norm 7,684 + log-probs 4 * 32768 + ids 16.
    per_token = 12 * (15_368 + 6_192 + 16_384) + 7_684 + 131_072 + 16
    assert per_token == 594_100
    rope, weight_copies = 2 * 1024 * 64 * 4, 2 * 100_663_296
    assert est.activation_bytes == 16 * 1024 * per_token + rope + weight_copies
    assert est.kv_cache_bytes_per_token == 2 * 12 * 4 * 64 * 2  # 12,288: GQA stores 4 of the 12 heads
    sharded = estimate_training_memory(GPT2_SMALL, 16, 1024, "bf16-mixed", shards=8)
    assert (
        sharded.optimizer_bytes == est.optimizer_bytes // 8
        and sharded.activation_bytes == est.activation_bytes
    )


@pytest.mark.parametrize(("precision", "dtype"), [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16)])
def test_kv_cache_bytes_per_token_match_an_allocated_cache(precision, dtype):
    cache = KVCache.allocate(GPT2_SMALL, batch_size=2, max_len=16, device="meta", dtype=dtype)
    assert kv_cache_bytes_per_token(GPT2_SMALL, precision) * 2 * 16 == cache.nbytes


def test_report_says_whether_the_run_fits():
    lines = fit_report(GPT2_SMALL, 16, 1024, "bf16-mixed", device_bytes=80 * 2**30, peak_flops=989e12)
    text = "\n".join(lines)
    assert "parameters: 100,682,496 (100.7 M)" in text
    assert "KV cache: 12,288 bytes per token" in text
    short = fit_report(GPT2_SMALL, 16, 256, "bf16-mixed")  # training windows shorter than the model's context
    assert (
        f"KV cache: 12,288 bytes per token (12.00 MiB per {GPT2_SMALL.block_size:,}-token sequence)" in short
    )
    assert "training FLOPs per token: 717.2 M" in text
    assert "fits" in lines[-1] and "NOT" not in lines[-1]
    small_gpu = fit_report(GPT2_SMALL, 16, 1024, "bf16-mixed", device_bytes=8 * 2**30)
    assert "DOES NOT FIT" in small_gpu[-1] and "data.batch_size" in small_gpu[-1]


def test_with_adapters_only_they_have_gradients_and_adamw_state():
    from model.lora import LoRAConfig, add_lora

    model = add_lora(GPT(GPT2_SMALL), LoRAConfig(rank=8))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    full = estimate_training_memory(GPT2_SMALL, 4, 256, "32-true")
    lora = estimate_training_memory(GPT2_SMALL, 4, 256, "32-true", trainable=trainable, weight_bytes=stored)
    assert (lora.grad_bytes, lora.optimizer_bytes, lora.weight_bytes) == (
        4 * trainable,
        8 * trainable,
        stored,
    )
    assert lora.activation_bytes == full.activation_bytes
    assert f"trained: {trainable:,} in the adapters" in fit_report(GPT2_SMALL, 4, 256, "32-true",
                                                                     trainable=trainable, weight_bytes=stored)[0]  # fmt: skip
