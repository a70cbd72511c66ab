"""Speculative decoding is exact: greedy tokens equal plain greedy, sampling keeps the target distribution."""

import pytest
import torch

from common.errors import UserError
from generation.sampling import GREEDY, Sampler, generate
from generation.speculative import DraftModel, PromptLookup, check_draft, speculative_generate, verify
from model import GPT, KVCache
from tests.model.lively import lively_model

CPU = torch.device("cpu")


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
    plain = generate(target, prompt, 200, sampler=GREEDY)
    assert plain[0, 16:].unique().numel() >= 20, "degenerate model: the comparison would prove nothing"
    chosen = DraftModel(noisy_copy(target, 0.3)) if drafter == "draft_model" else PromptLookup()
    out, stats = speculative_generate(target, prompt, 200, chosen, k=4, sampler=Sampler(temperature=0.0))
    assert 0 < stats.accepted < stats.drafted, (
        "rounds with both accepted and rejected drafts are what is tested"
    )
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
    assert torch.allclose(cache.k, fresh.k, rtol=0, atol=1e-12) and torch.allclose(
        cache.v, fresh.v, rtol=0, atol=1e-12
    )
    nxt = idx[:, 23:25]  # and decoding goes on as if the rejected tokens had never been fed
    assert torch.allclose(target(nxt, cache), target(nxt, fresh), rtol=0, atol=1e-10)


def sample_two_tokens(p0, p1, q0, q1, lookup: bool, gen: torch.Generator) -> tuple[int, int]:
    """The first two tokens of a speculative run with k = 2, the target's logits given as tables.

    p0 (V,) and p1 (V, V) are the target's next-token probabilities (p1's row: the first token), q0 and q1 the
    draft's. Prompt lookup drafts "2 3" deterministically. A round that emits only one token is followed by a
    plain target step, as in `speculative_generate`.
    """
    sampler = Sampler(temperature=1.0, generator=gen)
    if lookup:
        drafts, q = [2, 3], None
    else:
        d1 = int(torch.multinomial(q0, 1, generator=gen))
        d2 = int(torch.multinomial(q1[d1], 1, generator=gen))
        drafts, q = [d1, d2], torch.stack([q0, q1[d1]])
    logits = torch.stack([p0, p1[drafts[0]], p1[drafts[1]]]).log()  # the third row is unused here
    out = verify(logits, drafts, q, sampler)
    if len(out) == 1:
        out.append(sampler.draw(p1[out[0]]))
    return out[0], out[1]


@pytest.mark.parametrize("drafter", ["draft_model", "prompt_lookup"])
def test_speculative_sampling_keeps_the_target_distribution(drafter):
    vocab, runs = 4, 4000
    gen = torch.Generator().manual_seed(0)
    p0, p1 = torch.rand(vocab, generator=gen) + 0.2, torch.rand(vocab, vocab, generator=gen) + 0.2
    q0, q1 = torch.rand(vocab, generator=gen) ** 3 + 0.05, torch.rand(vocab, vocab, generator=gen) ** 3 + 0.05
    p0, p1, q0, q1 = (
        p0 / p0.sum(),
        p1 / p1.sum(-1, keepdim=True),
        q0 / q0.sum(),
        q1 / q1.sum(-1, keepdim=True),
    )
    counts = torch.zeros(vocab, vocab)
    for _ in range(runs):
        counts[sample_two_tokens(p0, p1, q0, q1, drafter == "prompt_lookup", gen)] += 1

    def chi_square(joint: torch.Tensor) -> float:
        expected = joint.flatten() * runs
        return float(((counts.flatten() - expected) ** 2 / expected.clamp(min=1e-9)).sum())

    critical = 37.7  # chi-square, 15 degrees of freedom, p = 0.001
    assert chi_square(p0[:, None] * p1) < critical
    # The bound has the power to reject the drafter's own distribution (for lookup: always "2 3").
    draft_joint = (
        q0[:, None] * q1
        if drafter == "draft_model"
        else torch.zeros(vocab, vocab).index_put_((torch.tensor(2), torch.tensor(3)), torch.tensor(1.0))
    )
    assert chi_square(draft_joint) > critical


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
    plain = generate(target, prompt, 30, sampler=GREEDY)
    eos = int(plain[0, 20])
    expected = plain[0, : 8 + (plain[0, 8:] == eos).nonzero()[0, 0] + 1]
    out, _ = speculative_generate(target, prompt, 30, PromptLookup(), sampler=Sampler(0.0), eos_id=eos)
    assert torch.equal(out[0], expected)


def test_any_of_several_eos_ids_stops_the_speculative_run_as_it_stops_generate(target):
    """Models such as Llama 3 have several stop ids; the one emitted first need not be the first listed."""
    prompt = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1))
    plain = generate(target, prompt, 30, sampler=GREEDY)[0, 8:].tolist()
    unused = next(i for i in range(101) if i not in plain)
    stops = [unused, plain[12]]  # the first listed never occurs
    expected = generate(target, prompt, 30, sampler=GREEDY, eos_id=stops)
    assert expected.shape[1] == 8 + plain.index(plain[12]) + 1 < 8 + 30  # generate stopped early
    out, _ = speculative_generate(target, prompt, 30, PromptLookup(), sampler=Sampler(0.0), eos_id=stops)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("draft_block", [1, 6])
def test_a_draft_with_a_short_window_slides_by_the_rule_of_generate(target, draft_block):
    """A draft whose block_size is below the target's (1: a window of one token; 6 with k = 5: the drafts
    overrun half the window) keeps its own window by `context_start` and never overfills its cache."""
    from model import ModelConfig

    draft = noisy_copy(target, 0.3)
    short = GPT(ModelConfig(**{**draft.config.to_dict(), "block_size": draft_block})).double().eval()
    short.load_state_dict(draft.state_dict())
    prompt = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1))
    plain = generate(target, prompt, 60, sampler=GREEDY)
    drafter = DraftModel(short)
    out, stats = speculative_generate(target, prompt, 60, drafter, k=5, sampler=Sampler(temperature=0.0))
    assert stats.drafted > 0 and torch.equal(out, plain)
