"""The readable FlashAttention reference against the fused SDPA path, across the masking and GQA cases."""

import pytest
import torch

from model.attention import sdpa_attention
from model.flash_reference import flash_attention


def qkv(t, s, h=8, hkv=2, d=16, b=2, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, t, d, generator=g) * scale,
        torch.randn(b, hkv, s, d, generator=g) * scale,
        torch.randn(b, hkv, s, d, generator=g),
    )


@pytest.mark.parametrize(
    ("t", "s"), [(37, 37), (1, 37), (11, 37), (16, 16)], ids=["prefill", "decode", "chunk", "even"]
)
@pytest.mark.parametrize("hkv", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_flash_reference_equals_sdpa(t, s, hkv):
    q, k, v = qkv(t, s, hkv=hkv)
    # Tiles of 8 keys and 5 queries: neither divides 37, so ragged last tiles and diagonal-crossing tiles occur.
    out = flash_attention(q, k, v, block_size_q=5, block_size_k=8)
    assert out.shape == q.shape
    assert (out - sdpa_attention(q, k, v)).abs().max().item() <= 1e-5


@pytest.mark.parametrize(("block_q", "block_k"), [(1, 1), (64, 64), (3, 100), (100, 3)])
def test_result_does_not_depend_on_tile_sizes(block_q, block_k):
    q, k, v = qkv(23, 30, hkv=2)
    out = flash_attention(q, k, v, block_size_q=block_q, block_size_k=block_k)
    assert (out - sdpa_attention(q, k, v)).abs().max().item() <= 1e-5


def test_large_scores_are_stable_thanks_to_the_running_max():
    # Scores near 1e3 would overflow a naive exp(score); the running max keeps every exp() argument <= 0.
    q, k, v = qkv(20, 20, hkv=4, scale=12.0)
    out = flash_attention(q, k, v, block_size_q=4, block_size_k=4)
    assert torch.isfinite(out).all()
    assert (out - sdpa_attention(q, k, v)).abs().max().item() <= 1e-4


def test_low_precision_inputs_are_accumulated_in_float32():
    q, k, v = (x.to(torch.bfloat16) for x in qkv(19, 19))
    out = flash_attention(q, k, v, block_size_q=4, block_size_k=4)
    assert out.dtype == torch.bfloat16
    reference = sdpa_attention(q.float(), k.float(), v.float())
    assert (out.float() - reference).abs().max().item() <= 2e-2


def test_bad_shapes_name_the_problem():
    q, k, v = qkv(9, 5)
    with pytest.raises(ValueError, match="must not exceed key length"):
        flash_attention(q, k, v)
    q, k, v = qkv(5, 5, h=6, hkv=4)
    with pytest.raises(ValueError, match="divisible by n_kv_head"):
        flash_attention(q, k, v)


class RecordOps(torch.overrides.TorchFunctionMode):
    """Records the name of every torch call and the largest tensor any call returns."""

    def __init__(self):
        super().__init__()
        self.names, self.largest = [], 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.names.append(getattr(func, "__name__", str(func)))
        if isinstance(result, torch.Tensor):
            self.largest = max(self.largest, result.numel())
        return result


def test_never_forms_the_full_score_matrix_and_skips_tiles_above_the_diagonal():
    q, k, v = qkv(32, 32, h=4, hkv=4, d=8, b=1)
    with RecordOps() as ops:
        flash_attention(q, k, v, block_size_q=8, block_size_k=8)
    assert ops.largest < 32 * 32 * 4  # the largest tensor is the output (B, H, T, D), not (B, H, T, S)
    # 4 query tiles see 1, 2, 3, 4 key tiles: 10 tile pairs of 2 matmuls each, not the 16 pairs of a full grid.
    assert sum(name in ("matmul", "__matmul__") for name in ops.names) == 2 * 10
