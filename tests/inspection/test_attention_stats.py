"""Per-head attention statistics on hand-built heads with known answers, and on a tiny GPT."""

import math

import pytest
import torch

from inspection.attention_stats import (
    attention_entropy,
    head_statistics,
    induction_score,
    previous_token_score,
    repeated_random_tokens,
    sink_mass,
)
from model import GPT, ModelConfig

T = 12


def previous_token_head(t=T):
    probs = torch.zeros(t, t)
    probs[0, 0] = 1.0  # row 0 can only see itself
    probs[torch.arange(1, t), torch.arange(t - 1)] = 1.0
    return probs


def sink_head(t=T):
    probs = torch.zeros(t, t)
    probs[:, 0] = 1.0
    return probs


def uniform_causal_head(t=T):
    mask = torch.ones(t, t).tril()
    return mask / mask.sum(dim=-1, keepdim=True)


def induction_head(period):
    probs = sink_head(2 * period)  # rows without an earlier occurrence park their weight on the first token
    rows = torch.arange(period, 2 * period)
    probs[rows] = 0.0
    probs[rows, rows - period + 1] = 1.0
    return probs


def heads(*maps, batch=2):
    """(B, H, T, T) with the given heads, the same in every batch row."""
    return torch.stack(maps).expand(batch, -1, -1, -1)


def test_previous_token_head():
    probs = heads(previous_token_head())
    assert previous_token_score(probs).tolist() == pytest.approx([1.0])
    assert attention_entropy(probs).tolist() == pytest.approx([0.0], abs=1e-7)
    assert sink_mass(probs).tolist() == pytest.approx([1 / (T - 1)])  # only row 1's previous token is key 0


def test_sink_head():
    probs = heads(sink_head())
    assert sink_mass(probs).tolist() == pytest.approx([1.0])
    assert attention_entropy(probs).tolist() == pytest.approx([0.0], abs=1e-7)


def test_uniform_causal_head():
    probs = heads(uniform_causal_head())
    expected_entropy = sum(math.log(t + 1) for t in range(T)) / T
    assert attention_entropy(probs).item() == pytest.approx(expected_entropy, rel=1e-6)
    assert previous_token_score(probs).item() == pytest.approx(
        sum(1 / (t + 1) for t in range(1, T)) / (T - 1)
    )


def test_induction_pattern_scores_one_and_uniform_head_does_not():
    period = 6
    probs = heads(induction_head(period), uniform_causal_head(2 * period), previous_token_head(2 * period))
    scores = induction_score(probs, period)
    assert scores[0].item() == pytest.approx(1.0)
    assert scores[1].item() == pytest.approx(sum(1 / (t + 1) for t in range(period, 2 * period)) / period)
    assert scores[1].item() < 0.2
    assert scores[2].item() == pytest.approx(0.0)


def test_layer_axis_gives_one_row_per_layer():
    layer0 = heads(sink_head(), previous_token_head())
    layer1 = heads(previous_token_head(), sink_head())
    scores = sink_mass(torch.stack([layer0, layer1]))  # (L, B, H, T, T) -> (L, H)
    assert scores.shape == (2, 2)
    assert scores.diagonal().tolist() == pytest.approx([1.0, 1.0])


def test_repeated_random_tokens_repeat_with_the_period():
    ids = repeated_random_tokens(vocab_size=50, period=7, batch=3, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (3, 14) and ids.dtype == torch.int64
    assert torch.equal(ids[:, :7], ids[:, 7:])
    assert ids.min() >= 0 and ids.max() < 50


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match=r"\(B, H, T, T\)"):
        sink_mass(torch.ones(4, 4))
    with pytest.raises(ValueError, match="at least 7 tokens"):
        induction_score(heads(sink_head(6)), period=6)


def test_head_statistics_on_a_tiny_gpt():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    model = GPT(config).eval()
    probe = torch.randint(0, 64, (2, 16))
    stats = head_statistics(model, probe, induction_period=8, generator=torch.Generator().manual_seed(0))
    assert set(stats) == {"entropy", "sink_mass", "previous_token", "induction"}
    for name, values in stats.items():
        assert values.shape == (2, 4), name
        assert torch.isfinite(values).all(), name
    for name in ("sink_mass", "previous_token", "induction"):
        assert ((stats[name] >= 0) & (stats[name] <= 1)).all(), name
    assert ((stats["entropy"] >= 0) & (stats["entropy"] <= math.log(16))).all()
    with pytest.raises(ValueError, match="block_size 32"):
        head_statistics(model, probe, induction_period=17)


def test_head_statistics_induction_uses_the_models_maps_of_the_repeated_sequence():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    model = GPT(config).eval()
    with torch.no_grad():  # large weights: maps that depend on the tokens, not the near-uniform ones of init
        for name, param in model.named_parameters():
            param.normal_(1.0, 0.3) if name.endswith("norm.weight") else param.normal_(0.0, 0.3)
    probe = torch.randint(0, 64, (2, 16))
    stats = head_statistics(model, probe, induction_period=8, induction_batch=3,
                            generator=torch.Generator().manual_seed(7))  # fmt: skip
    repeated = repeated_random_tokens(64, 8, 3, torch.Generator().manual_seed(7))
    expected = induction_score(model.attention_maps(repeated), 8)
    assert torch.allclose(stats["induction"], expected, atol=1e-6)
    # The same score on the probe's maps is far off, so the equality above says which maps were used.
    assert (induction_score(model.attention_maps(probe), 8) - expected).abs().max() > 0.05
