"""Exact speculative decoding: a cheap drafter proposes tokens, the target checks them all in one forward.

Each round feeds the target its last token plus up to k drafts (a chunked prefill), giving its distribution
after every prefix at once. Drafts are kept while the target agrees; the first disagreement is replaced by the
target's own choice, and the cache forgets the rejected tokens. Greedy output equals plain greedy decoding;
sampled, the accept rule (accept d with probability min(1, p(d) / q(d)), else draw from the normalised
max(p - q, 0)) leaves the output distributed exactly as the target's. A round is one step of `decode`, and
the target reads through a `Context`, so it sees the same windows as plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import torch

from common.errors import UserError
from model.cache import KVCache
from model.gpt import GPT

from .sampling import Context, Sampler, Stop, decode, first_finite, naming_the_broken_layer


class Drafter(Protocol):
    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], torch.Tensor | None]:
        """Up to k tokens to follow idx (1, n), and their draft distributions (k, V), or None if deterministic."""


class PromptLookup:
    """Drafts by copying: find the latest earlier occurrence of the last n tokens and propose what followed."""

    max_ngram = 3

    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], None]:
        seq = idx[0]
        for size in range(min(self.max_ngram, seq.numel() - 1), 0, -1):
            windows = seq.unfold(0, size, 1)[:-1]  # every earlier n-gram, (n - size, size)
            hits = (windows == seq[-size:]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + size
                return seq[start : start + k].tolist(), None
        return [], None


class DraftModel:
    """Drafts with a smaller GPT sharing the target's tokenizer, from its own cache and its own window."""

    def __init__(self, model: GPT) -> None:
        self.model, self.context = model, Context(model, KVCache.for_model(model, 1))

    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], torch.Tensor | None]:
        n, dists = idx.shape[1], []
        # The k - 1 drafts fed after the window must fit in it too.
        k = min(k, self.model.config.block_size + 1 - (n - self.context.window_start(n)))

        def draft_step(seq: torch.Tensor, room: int) -> torch.Tensor:
            dists.append(sampler.probs(self.context.logits(seq)[0, -1]))
            return seq.new_tensor([[sampler.draw(dists[-1])]])

        drafts = decode(idx, k, draft_step, Stop(None, 1, idx.device))[0, n:].tolist()  # no stop ids
        return drafts, None if sampler.greedy else torch.stack(dists)


@dataclass
class SpeculativeStats:
    """Counts of one speculative run: acceptance rate = accepted / drafted."""

    drafted: int = 0
    accepted: int = 0
    target_forwards: int = 0
    new_tokens: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def verify(logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, sampler: Sampler) -> list[int]:
    """The tokens a round emits: the accepted drafts, then one token of the target's own. logits
    (len(drafts) + 1, V) are the target's after each prefix; q (len(drafts), V) the draft distributions, None
    for a deterministic drafter (a one-hot q)."""
    p = sampler.probs(logits)
    for i, token in enumerate(drafts):
        if sampler.greedy:
            keep = token == int(logits[i].argmax())
        else:
            q_token = 1.0 if q is None else float(q[i, token])
            keep = float(torch.rand((), generator=sampler.generator)) < min(1.0, float(p[i, token]) / q_token)
        if not keep:
            q_row = torch.nn.functional.one_hot(torch.tensor(token), p.shape[-1]) if q is None else q[i]
            residual = (p[i] - q_row).clamp(min=0)
            return drafts[:i] + [sampler.draw(residual / residual.sum() if residual.sum() > 0 else p[i])]
    return drafts + [sampler.draw(p[len(drafts)])]


@torch.inference_mode()
def speculative_generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    drafter: Drafter,
    *,
    k: int = 4,
    sampler: Sampler = Sampler(),
    eos_id: int | Collection[int] | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, SpeculativeStats]:
    """Continue idx (1, T) by up to max_new_tokens tokens, k drafted per target forward; (1, T + new) and stats.
    `eos_id` is one stop id or several, as for `generate`."""
    if idx.shape[0] != 1:
        raise UserError(f"speculative decoding runs one sequence at a time; got a batch of {idx.shape[0]}")
    if k < 1 or max_new_tokens < 1:
        raise UserError(
            f"speculative decoding needs k >= 1 and max_new_tokens >= 1, got {k} and {max_new_tokens}"
        )
    # The accept test compares two distributions fixed per prefix; a penalty would change them as tokens arrive.
    if sampler.repetition_penalty != 1.0:
        raise UserError(
            "speculative decoding samples without a repetition penalty; use plain decoding for it"
        )
    stats, target = SpeculativeStats(), Context(model, KVCache.for_model(model, 1))
    block_size, fed, check = model.config.block_size, [], first_finite()

    def one_round(seq: torch.Tensor, room: int) -> torch.Tensor:
        n = seq.shape[1]
        room = min(k, block_size - (n - target.window_start(n)), room - 1)
        drafts, q = drafter.propose(seq, room, sampler) if room > 0 else ([], None)
        logits = check(target.logits(torch.cat([seq, seq.new_tensor([drafts])], dim=1), len(drafts) + 1)[0])
        emitted = verify(logits, drafts, q, sampler)  # the accepted drafts, then one token of the target's
        stats.target_forwards += 1
        stats.drafted += len(drafts)
        fed.append((n, len(emitted) - 1))
        return seq.new_tensor([emitted])

    with naming_the_broken_layer(model, idx):
        out = decode(idx, max_new_tokens, one_round, Stop(eos_id, 1, idx.device), on_token)
    stats.new_tokens = out.shape[1] - idx.shape[1]
    # The drafts kept: all those accepted, but none after a stop token that ended the last round.
    stats.accepted = sum(min(accepted, out.shape[1] - n) for n, accepted in fed)
    return out, stats


def check_draft(target: GPT, draft: GPT, target_tokenizer_sha: str, draft_tokenizer_sha: str) -> None:
    """Refuse a draft that does not share the target's tokenizer and vocabulary, with one line."""
    if draft_tokenizer_sha != target_tokenizer_sha:
        raise UserError(
            "the draft model has a different tokenizer from the target; use a draft trained with the same "
            "tokenizer.json"
        )
    if draft.config.vocab_size != target.config.vocab_size:
        raise UserError(
            f"the draft's vocab_size {draft.config.vocab_size} differs from the target's "
            f"{target.config.vocab_size}; use a draft with the target's vocabulary"
        )
