"""Cached decoding must reproduce the full forward, for MHA, GQA and MQA."""

import functools

import pytest
import torch
import torch.nn.functional as F

from generation.sampling import GREEDY, Sampler, generate
from model import GPT, KVCache, ModelConfig
from model.attention import explicit_attention, sdpa_attention
from model.cache import cache_bytes
from tests.model import lively

HEAD_LAYOUTS = {"mha": 8, "gqa": 2, "mqa": 1}


def tiny_model(n_kv_head: int, block_size: int = 64, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=97, block_size=block_size, n_layer=2, n_head=8, n_kv_head=n_kv_head, n_embd=64
    )
    return GPT(config).eval()


# The shared varied-output model, in this file's shape (vocabulary 97, 8 heads) and in float32.
lively_model = functools.partial(
    lively.lively_model, block_size=64, vocab=97, n_head=8, n_embd=64, dtype=torch.float32
)


def distinct_new_tokens(out: torch.Tensor, prompt_len: int) -> list[int]:
    """How many different token ids each row generated after its prompt."""
    return [len(set(row[prompt_len:].tolist())) for row in out]


@pytest.mark.parametrize("n_kv_head", HEAD_LAYOUTS.values(), ids=HEAD_LAYOUTS.keys())
def test_token_by_token_decode_matches_full_forward(n_kv_head):
    model = tiny_model(n_kv_head)
    idx = torch.randint(0, 97, (2, 48))
    full = model(idx)
    cache = KVCache.allocate(model.config, 2, 64)
    steps = [model(idx[:, :16], cache)] + [model(idx[:, t : t + 1], cache) for t in range(16, 48)]
    assert cache.pos == 48
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4


@pytest.mark.parametrize("n_kv_head", HEAD_LAYOUTS.values(), ids=HEAD_LAYOUTS.keys())
@pytest.mark.parametrize("chunks", [(7, 30, 11), (29, 19)])
def test_chunked_prefill_matches_full_forward(n_kv_head, chunks):
    model = tiny_model(n_kv_head)
    idx = torch.randint(0, 97, (3, sum(chunks)))
    full = model(idx)
    cache = KVCache.allocate(model.config, 3, 64)
    pieces, start = [], 0
    for length in chunks:
        pieces.append(model(idx[:, start : start + length], cache))
        start += length
    assert (torch.cat(pieces, dim=1) - full).abs().max().item() <= 1e-4


def test_last_only_logits_equal_the_full_forwards_last_position():
    model = lively_model(2)
    idx = torch.randint(0, 97, (2, 40))
    full = model(idx)
    last = model(idx, last_only=True)
    assert last.shape == (2, 1, 97) and (last - full[:, -1:]).abs().max().item() <= 1e-4
    cache = KVCache.allocate(model.config, 2, 64)
    model(idx[:, :25], cache, last_only=True)  # keeps only its last logits, still fills the cache
    assert cache.pos == 25
    assert (model(idx[:, 25:], cache, last_only=True) - full[:, -1:]).abs().max().item() <= 1e-4


def test_generate_runs_the_lm_head_on_one_position_per_call():
    """The prefill needs only the last position's logits; the LM head on every prompt token is wasted work."""
    model = tiny_model(2, block_size=32)
    head_lengths = []
    model.lm_head.register_forward_hook(lambda module, args, out: head_lengths.append(args[0].shape[1]))
    generate(model, torch.randint(0, 97, (1, 20)), 40, sampler=GREEDY)  # 40 new tokens: the window jumps
    assert len(head_lengths) == 40 and set(head_lengths) == {1}


@pytest.mark.parametrize("n_kv_head", HEAD_LAYOUTS.values(), ids=HEAD_LAYOUTS.keys())
def test_greedy_generate_with_cache_equals_recompute(n_kv_head):
    # 100 new tokens on a 32-token context: the window slides several times, both paths must agree anyway.
    model = lively_model(n_kv_head, block_size=32, seed=1)
    prompt = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(5))
    cached = generate(model, prompt, 100, sampler=GREEDY)
    recomputed = generate(model, prompt, 100, sampler=GREEDY, use_cache=False)
    assert cached.shape == (2, 110)
    assert min(distinct_new_tokens(cached, 10)) >= 20  # not one repeated token: a wrong cache would show
    assert torch.equal(cached, recomputed)


def test_seeded_sampling_with_cache_equals_recompute():
    model = lively_model(2)
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(5))

    def sample(use_cache: bool, seed: int = 123) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return generate(
            model, prompt, 50, sampler=Sampler(temperature=0.9, top_k=20, generator=gen), use_cache=use_cache
        )

    cached = sample(True)
    assert min(distinct_new_tokens(cached, 5)) >= 20
    assert torch.equal(cached, sample(False))
    assert not torch.equal(cached, sample(True, seed=124))  # the generator, not the model alone, decides


def test_future_tokens_do_not_leak():
    model = tiny_model(2)
    idx = torch.randint(0, 97, (1, 40))
    changed = idx.clone()
    changed[:, 25:] = torch.randint(0, 97, (1, 15))
    before, after = model(idx), model(changed)
    assert torch.equal(before[:, :25], after[:, :25])
    assert not torch.allclose(before[:, 25:], after[:, 25:])


def test_cache_size_scales_with_kv_heads_and_stays_out_of_state_dict():
    mha, gqa = tiny_model(8), tiny_model(2)
    mha_cache = KVCache.allocate(mha.config, 4, 64)
    gqa_cache = KVCache.allocate(gqa.config, 4, 64)
    assert mha_cache.nbytes == 4 * gqa_cache.nbytes
    assert mha_cache.nbytes / gqa_cache.nbytes == mha.config.n_head / gqa.config.n_kv_head
    assert gqa_cache.k.shape == (2, 4, 2, 64, 8)
    # k and v, layers, kv heads, head_dim, fp32: per position of one sequence, the rule sizes the buffers exactly
    assert cache_bytes(gqa.config, 1, 4) == 2 * 2 * 2 * 8 * 4
    assert gqa_cache.nbytes == 4 * cache_bytes(gqa.config, gqa_cache.max_len, 4)
    assert torch.count_nonzero(gqa_cache.k) == 0 and torch.count_nonzero(gqa_cache.v) == 0
    before = set(gqa.state_dict())
    gqa(torch.randint(0, 97, (4, 8)), gqa_cache)
    assert set(gqa.state_dict()) == before
    assert not any("cache" in name for name in before)
    assert list(gqa.buffers()) == []


def test_writing_past_the_cache_raises_a_clear_error():
    model = tiny_model(2)
    cache = KVCache.allocate(model.config, 1, 16)
    model(torch.randint(0, 97, (1, 12)), cache)
    with pytest.raises(ValueError, match="KVCache is full"):
        model(torch.randint(0, 97, (1, 5)), cache)


def test_eos_stops_one_row_mid_sequence_and_pads_it_while_the_other_goes_on():
    model = lively_model(2)
    prompt = torch.randint(0, 97, (2, 4), generator=torch.Generator().manual_seed(5))
    free = generate(model, prompt, 30, sampler=GREEDY)[:, 4:]
    # The stop token: the first token row 0 emits at step 3 or later that row 1 never emits.
    candidates = [(int(t), i) for i, t in enumerate(free[0].tolist()) if i >= 3 and t not in free[1]]
    assert candidates, "every token of row 0 also appears in row 1: pick another seed"
    eos, stop = candidates[0]
    assert stop <= 20 and (free[0, stop + 1 :] != eos).any()  # without padding, row 0 would differ
    out = generate(model, prompt, 30, sampler=GREEDY, eos_id=eos)[:, 4:]
    assert out.shape == (2, 30)  # row 1 never stops, so decoding runs to max_new_tokens
    assert torch.equal(out[1], free[1])
    assert torch.equal(out[0, : stop + 1], free[0, : stop + 1])
    assert (out[0, stop:] == eos).all()


# (query heads, key/value heads): MHA, GQA with groups of 3 (SmolLM2's 9/3) and of 4, MQA.
ONE_QUERY_LAYOUTS = {"mha": (4, 4), "gqa3": (9, 3), "gqa4": (8, 2), "mqa": (4, 1)}


@pytest.mark.parametrize(("n_head", "n_kv_head"), ONE_QUERY_LAYOUTS.values(), ids=ONE_QUERY_LAYOUTS.keys())
@pytest.mark.parametrize("cached", [2, 7, 300, 2100])  # 1 would take the T == S branch
def test_one_query_attention_folds_query_groups_with_the_enable_gqa_and_explicit_values(
    n_head, n_kv_head, cached
):
    """A decode step folds each key head's query heads into query rows; values must not move (fp32, 1e-6).

    The key heads are independent draws, so a query head read against another head's keys is off by O(1).
    """
    gen = torch.Generator().manual_seed(cached + n_head)
    q = torch.randn(2, n_head, 1, 64, generator=gen)
    k, v = (torch.randn(2, n_kv_head, cached, 64, generator=gen) for _ in range(2))
    folded = sdpa_attention(q, k, v)
    assert folded.shape == (2, n_head, 1, 64)
    assert (folded - F.scaled_dot_product_attention(q, k, v, enable_gqa=True)).abs().max().item() <= 1e-6
    explicit, probs = explicit_attention(q, k, v)
    assert (folded - explicit).abs().max().item() <= 1e-6
    # The explicit maps still describe what the fused step computes: one row over every cached key per head.
    assert probs.shape == (2, n_head, 1, cached)
    assert torch.allclose(probs.sum(-1), torch.ones(2, n_head, 1))
    mixed = probs @ v.repeat_interleave(n_head // n_kv_head, dim=1)
    assert (folded - mixed).abs().max().item() <= 1e-6


def test_the_eager_cache_holds_prompt_plus_new_tokens_and_still_slides_when_longer(monkeypatch):
    model = lively_model(2, block_size=64, seed=1)
    allocated = []
    allocate = KVCache.allocate
    monkeypatch.setattr(
        KVCache, "allocate", lambda *args, **kwargs: allocated.append(args[2]) or allocate(*args, **kwargs)
    )
    prompt = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(6))
    for new_tokens in (22, 54, 90):  # 32 positions; 64, the context exactly; 100: the window slides
        cached = generate(model, prompt, new_tokens, sampler=GREEDY)
        assert min(distinct_new_tokens(cached, 10)) >= 8
        assert torch.equal(cached, generate(model, prompt, new_tokens, sampler=GREEDY, use_cache=False))
    assert allocated == [32, 64, 64]
