"""benchmarks/device_check.py: its --cpu_smoke run passes, and each guard fails when what it guards breaks."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from benchmarks import device_check
from benchmarks.device_check import check_sdpa, exit_code
from benchmarks.lightning_checks import Row, fused_attention_ops

CHECKS = ("sdpa fused for training", "train attention kernels", "train loss falls", "resume exact")


@pytest.mark.slow  # a subprocess that trains
def test_cpu_smoke_runs_every_check_and_passes(script):
    result = script("-m", "benchmarks.device_check", "--cpu_smoke", timeout=900)
    table = result.stdout
    assert "all checks passed" in table
    for check in CHECKS:
        line = next(line for line in table.splitlines() if line.startswith(check))
        assert line.split()[len(check.split())] == "PASS", line
    for info in ("train tokens/s", "train MFU", "train peak memory", "decode tokens/s"):
        assert any(line.startswith(info) for line in table.splitlines()), info
    assert "MBU" in next(
        line for line in table.splitlines() if line.startswith("decode tokens/s (compile=True)")
    )


def _attention_with_dropout(q, k, v):
    # Attention dropout is what the CPU flash kernel cannot do: the math kernel would run it.
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1, enable_gqa=True)


def test_sdpa_check_fails_when_attention_falls_back_to_math():
    shape = (2, 4, 2, 32, 16)
    assert check_sdpa("cpu", shape)[-1].status == "PASS"
    rows = check_sdpa("cpu", shape, attention=_attention_with_dropout)
    assert rows[-1].check == "sdpa fused for training" and rows[-1].status == "FAIL"


def test_profiled_attention_ops_must_all_be_fused():
    flash = {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::mm",
    }
    assert fused_attention_ops(flash) == (
        True,
        ["aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"],
    )
    assert fused_attention_ops({"aten::_scaled_dot_product_cudnn_attention"})[0]
    assert not fused_attention_ops(flash | {"aten::_scaled_dot_product_attention_math"})[0]
    assert not fused_attention_ops({"aten::_scaled_dot_product_efficient_attention"})[0]
    assert not fused_attention_ops({"aten::mm"})[0], "no attention kernel seen is not a pass"


def test_a_failed_or_crashed_check_makes_the_exit_code_1(capsys):
    assert exit_code([Row("a", "PASS", ""), Row("b", "INFO", "")]) == 0
    assert exit_code([Row("a", "PASS", ""), Row("b", "FAIL", "")]) == 1
    assert "FAILED: b" in capsys.readouterr().out

    def crash():
        raise RuntimeError("CUDA out of memory")

    rows = device_check._guarded("train", crash)
    assert rows == [Row("train", "FAIL", "RuntimeError", "CUDA out of memory")]
