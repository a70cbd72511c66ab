"""Speculative decoding is exact: greedy tokens equal plain greedy, sampling keeps the target distribution."""


import pytest
import torch

from common.errors import UserError
from model import GPT, KVCache, ModelConfig, generate
from model.speculative import DraftModel, PromptLookup, Sampler, check_draft, speculative_generate

CPU = torch.device("cpu")


def lively_model(vocab: int = 101, block_size: int = 48, n_kv_head: int = 2, seed: int = 0) -> GPT:
    """A random float64 model with large weights, so greedy output is varied (not one repeated token)."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=vocab, block_size=block_size, n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=32)
    model = GPT(config).double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(8) if param.dim() > 1 else param.uniform_(0.5, 2.0)
    return model


def noisy_copy(model: GPT, noise: float, seed: int = 5) -> GPT:
    """The target with perturbed weights: a draft that agrees often but not always."""
    draft = GPT(model.config).double().eval()
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * param.std() * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return draft


@pytest.fixture(scope="module")
def target() -> GPT:
    return lively_model()


@pytest.mark.parametrize("drafter", ["draft_model", "prompt_lookup"])
def test_speculative_greedy_equals_plain_greedy_across_window_jumps(target, drafter):
    # A repeated prompt gives prompt lookup something to copy; block_size 48 makes the window jump ~8 times.
    prompt = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1)).repeat(1, 2)
    plain = generate(target, prompt, 200, temperature=0.0)
    assert plain[0, 16:].unique().numel() >= 20, "degenerate model: the comparison would prove nothing"
    chosen = DraftModel(noisy_copy(target, 0.3), CPU, torch.float64) if drafter == "draft_model" else PromptLookup()
    out, stats = speculative_generate(target, prompt, 200, chosen, k=4, sampler=Sampler(temperature=0.0))
    assert 0 < stats.accepted < stats.drafted, "rounds with both accepted and rejected drafts are what is tested"
    assert stats.target_forwards < 200
    assert torch.equal(out, plain)


def test_rolled_back_cache_equals_a_fresh_prefill_of_the_kept_tokens(target):
    idx = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(3))
    cache = KVCache.allocate(target.config, 1, 48, dtype=torch.float64)
    target(idx[:, :20], cache)
    target(idx[:, 20:27], cache)  # a verification chunk whose last 4 tokens are then rejected
    cache.rollback(23)
    fresh = KVCache.allocate(target.config, 1, 48, dtype=torch.float64)
    target(idx[:, :23], fresh)
    assert cache.pos == fresh.pos == 23
    assert torch.equal(cache.k[:, :, :, 23:], fresh.k[:, :, :, 23:])  # the rejected positions are zero again
    assert torch.allclose(cache.k, fresh.k, rtol=0, atol=1e-12) and torch.allclose(cache.v, fresh.v, rtol=0, atol=1e-12)
    nxt = idx[:, 23:25]  # and decoding goes on as if the rejected tokens had never been fed
    assert torch.allclose(target(nxt, cache), target(nxt, fresh), rtol=0, atol=1e-10)


def joint_of_two_tokens(model: GPT, prompt: torch.Tensor) -> torch.Tensor:
    """Exact target probability (V, V) of the next two tokens after prompt, at temperature 1."""
    vocab = model.config.vocab_size
    first = model(prompt)[0, -1].softmax(-1)
    pairs = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
    second = model(pairs)[:, -1].softmax(-1)  # (V, V): row = first token
    return first[:, None] * second


@pytest.mark.parametrize("drafter", ["draft_model", "prompt_lookup"])
def test_speculative_sampling_keeps_the_target_distribution(drafter):
    vocab, runs = 4, 1200
    target = lively_model(vocab=vocab, seed=7)
    with torch.no_grad():  # soften the large test weights so every pair of tokens has a fair chance
        target.lm_head.weight.mul_(0.05)
    draft = noisy_copy(target, 1.0, seed=8)
    prompt = torch.tensor([[0, 1, 2, 3, 0, 1]])  # lookup drafts after "0 1": "2 3"
    want = joint_of_two_tokens(target, prompt)
    counts = torch.zeros(vocab, vocab)
    drafted = 0
    for seed in range(runs):
        chosen = DraftModel(draft, CPU, torch.float64) if drafter == "draft_model" else PromptLookup()
        sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(seed))
        out, stats = speculative_generate(target, prompt, 3, chosen, k=2, sampler=sampler)
        counts[out[0, 6], out[0, 7]] += 1
        drafted += stats.drafted
    assert drafted == 2 * runs  # every first round drafted two tokens: the accept/reject rule decided them

    def chi_square(probs: torch.Tensor) -> float:
        expected = probs.flatten().float() * runs
        return float(((counts.flatten() - expected) ** 2 / expected.clamp(min=1e-9)).sum())

    critical = 37.7  # chi-square, 15 degrees of freedom, p = 0.001
    assert chi_square(want) < critical
    if drafter == "draft_model":  # the bound has the power to tell the draft's own distribution apart
        assert chi_square(joint_of_two_tokens(draft, prompt)) > critical
    else:  # a copy-only drafter would always emit 2 3
        assert counts[2, 3] < runs * want[2, 3] + 4 * (runs * want[2, 3]) ** 0.5 + 1


def test_a_draft_with_another_vocabulary_or_tokenizer_is_refused(target):
    other_vocab = lively_model(vocab=99)
    with pytest.raises(UserError, match="vocab_size 99") as err:
        check_draft(target, other_vocab, "abc", "abc")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="tokenizer"):
        check_draft(target, target, "abc", "abd")


def test_batches_are_refused(target):
    with pytest.raises(UserError, match="batch"):
        speculative_generate(target, torch.zeros(2, 3, dtype=torch.long), 4, PromptLookup())


def test_eos_stops_the_speculative_run(target):
    prompt = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1))
    plain = generate(target, prompt, 30, temperature=0.0)
    eos = int(plain[0, 20])
    expected = plain[0, : 8 + (plain[0, 8:] == eos).nonzero()[0, 0] + 1]
    out, _ = speculative_generate(target, prompt, 30, PromptLookup(), sampler=Sampler(0.0), eos_id=eos)
    assert torch.equal(out[0], expected)
