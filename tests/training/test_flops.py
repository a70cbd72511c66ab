"""FLOPs per token against a hand count and torch's own FLOP counter; the GPU peak table; train/mfu."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from data.datamodule import TextDataModule
from model import GPT, ModelConfig
from tests.shapes import GPT2_SMALL
from training import LitGPT, ThroughputMonitor
from training.flops import matmul_params, peak_bf16_flops, training_flops_per_token


def test_flops_of_the_124m_config_match_a_hand_count():
    # Per layer: qkv 768 x (12 + 2 * 4) * 64 = 983,040; proj 768 * 768 = 589,824; SwiGLU hidden
    # ceil(8 * 768 / 3 / 64) * 64 = 2048: gate_up 768 * 4096 = 3,145,728, down 2048 * 768 = 1,572,864.
    per_layer = 983_040 + 589_824 + 3_145_728 + 1_572_864
    assert per_layer == 6_291_456
    lm_head = 768 * 32768  # 25,165,824; the tied embedding counts once, as the head
    assert matmul_params(GPT2_SMALL) == 12 * per_layer + lm_head == 100_663_296
    attention = 12 * 12 * 12 * 64 * 1024  # 12 * L * H * D * T = 113,246,208
    assert training_flops_per_token(GPT2_SMALL, 1024) == 6 * 100_663_296 + attention == 717_225_984


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_flops_match_torchs_flop_counter(tie):
    config = ModelConfig(
        vocab_size=512, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, tie_embeddings=tie
    )
    model, batch, seq = GPT(config), 3, 48
    idx = torch.randint(0, config.vocab_size, (batch, seq))
    # The math backend spells attention out as matmuls the counter sees (the CPU flash op is not counted).
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    assert counter.get_total_flops() == training_flops_per_token(config, seq) * batch * seq


def test_matmul_params_are_the_linear_weights_of_the_model():
    for tie in (True, False):
        config = ModelConfig(vocab_size=300, n_layer=3, n_head=6, n_kv_head=3, n_embd=96, tie_embeddings=tie)
        model = GPT(config)
        linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
        assert matmul_params(config) == sum(linear.values())


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA A10G", None),
        ("Tesla T4", None),
    ],
)
def test_peak_table_matches_device_names(name, peak):
    assert peak_bf16_flops(name) == peak


class _Metrics(L.Callback):
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k in ("train/mfu", "train/tokens_per_s")
        }
        if metrics and metrics not in self.rows:
            self.rows.append(metrics)


# Every logging step has its throughput, the first of a start included (a resume's first step often logs).
@pytest.mark.parametrize(("every", "logged"), [(2, 3), (1, 6)])
def test_mfu_is_logged_from_tokens_per_second_and_the_flop_count(corpus, data_cache, every, logged):
    peak = 1e9  # a stand-in peak: CPUs are not in the table
    recorder = _Metrics()
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=every,
        enable_checkpointing=False,
        callbacks=[ThroughputMonitor(peak_flops=peak), recorder],
    )
    data = TextDataModule(
        data_files=str(corpus), cache_dir=str(data_cache), vocab_size=384, block_size=32, batch_size=4
    )
    # The model's context (64) is longer than the batches' (32): MFU must count the attention actually run.
    module = LitGPT(
        vocab_size=384, block_size=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=32, warmup_steps=1
    )
    trainer.fit(module, data)
    assert len(recorder.rows) == logged  # steps 2, 4, 6, or each step
    flops = training_flops_per_token(module.model.config, 32)
    for row in recorder.rows:
        assert row["train/mfu"] == pytest.approx(row["train/tokens_per_s"] * flops / peak, rel=1e-6)
