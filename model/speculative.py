"""Exact speculative decoding: a cheap drafter proposes tokens, the target checks them all in one forward.

Each round the target is fed its last accepted token plus up to k drafted ones (a chunked prefill, so the
bottom-right aligned causal mask of model/attention.py), which gives its next-token distribution after every prefix at
once. Drafted tokens are kept while the target agrees, the first disagreement is replaced by the target's own
choice, and the cache is rolled back past the rejected tokens. Greedy output is token-identical to plain greedy
decoding; with sampling the accept/reject rule (accept d with probability min(1, p(d) / q(d)), else sample from
the normalised max(p - q, 0)) leaves the output distributed exactly as the target's.

Tokens are picked by the `Sampler` of plain decoding (model/sampling.py), and the window rule of `generate`
(`context_start`) is followed at every length, by the target and by a draft model in its own window, so the
target sees the same context as in plain decoding: a round never drafts past the end of the current window.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import torch

from common.errors import UserError

from .cache import KVCache
from .gpt import GPT
from .sampling import Sampler, context_start, stop_list


class Drafter(Protocol):
    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], torch.Tensor | None]:
        """Up to k tokens to follow idx (1, n), and their draft distributions (k, V), or None if deterministic."""

    def keep(self, n_valid: int) -> None:
        """The first n_valid tokens of the sequence are final; forget anything drafted after them."""


class PromptLookup:
    """Drafts by copying: find the latest earlier occurrence of the last n tokens and propose what followed."""

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], None]:
        seq = idx[0]
        for size in range(min(self.max_ngram, seq.numel() - 1), 0, -1):
            windows = seq.unfold(0, size, 1)[:-1]  # every earlier n-gram, (n - size, size)
            hits = (windows == seq[-size:]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + size
                return seq[start : start + k].tolist(), None
        return [], None

    def keep(self, n_valid: int) -> None:
        pass


class DraftModel:
    """Drafts with a smaller GPT sharing the target's tokenizer, from its own cache and its own window."""

    def __init__(self, model: GPT, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.start = model, 0
        self.cache = KVCache.allocate(model.config, 1, model.config.block_size, device=device, dtype=dtype)

    def propose(self, idx: torch.Tensor, k: int, sampler: Sampler) -> tuple[list[int], torch.Tensor | None]:
        n, block_size = idx.shape[1], self.model.config.block_size
        # The draft keeps its own window, by the rule of `generate`.
        new_start = context_start(self.start, n, block_size)
        if new_start != self.start:
            self.start = new_start
            self.cache.reset()
        # The window holds n - start tokens, and the k - 1 drafts fed after them must fit too.
        k = min(k, block_size + 1 - (n - self.start))
        catch_up = idx[:, self.start + self.cache.pos :]  # the tokens the draft has not seen yet
        logits = self.model(catch_up, self.cache, last_only=True)[0, -1]
        tokens, dists = [], []
        for i in range(k):
            probs = sampler.probs(logits)
            tokens.append(sampler.draw(probs))
            dists.append(probs)
            if i < k - 1:
                logits = self.model(idx.new_tensor([[tokens[-1]]]), self.cache)[0, -1]
        return tokens, None if sampler.greedy else torch.stack(dists)

    def keep(self, n_valid: int) -> None:
        if n_valid - self.start < self.cache.pos:
            self.cache.rollback(max(0, n_valid - self.start))


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
    """The tokens a round emits: the accepted drafts, then one token of the target's own.

    logits (len(drafts) + 1, V) are the target's after each prefix; q (len(drafts), V) the draft
    distributions, None for a deterministic drafter (a one-hot q).
    """
    p = sampler.probs(logits)
    out = []
    for i, token in enumerate(drafts):
        q_token = 1.0 if q is None else float(q[i, token])
        if sampler.greedy:
            keep = token == int(logits[i].argmax())
        else:
            keep = sampler.uniform() < min(1.0, float(p[i, token]) / q_token)
        if not keep:
            q_row = (
                torch.nn.functional.one_hot(torch.tensor(token), p.shape[-1]).float() if q is None else q[i]
            )
            residual = (p[i] - q_row).clamp(min=0)
            return out + [sampler.draw(residual / residual.sum() if residual.sum() > 0 else p[i])]
        out.append(token)
    return out + [sampler.draw(p[len(drafts)])]


# Eager even for a model compiled in place (`model.compile()`): that graph would be rebuilt for every position.
@torch.inference_mode()
@torch.compiler.set_stance("force_eager")
def speculative_generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    drafter: Drafter,
    *,
    k: int = 4,
    sampler: Sampler | None = None,
    eos_id: int | Collection[int] | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, SpeculativeStats]:
    """Continue idx (1, T) by up to max_new_tokens tokens, k drafted per target forward; (1, T + new) and stats.

    `eos_id` is one stop id or several, as for `generate`: the first one emitted ends the text.
    """
    if idx.shape[0] != 1:
        raise UserError(f"speculative decoding runs one sequence at a time; got a batch of {idx.shape[0]}")
    if k < 1 or max_new_tokens < 1:
        raise UserError(
            f"speculative decoding needs k >= 1 and max_new_tokens >= 1, got {k} and {max_new_tokens}"
        )
    sampler = (sampler or Sampler()).check()
    # The accept test compares two distributions fixed per prefix; a penalty would change them as tokens arrive.
    if sampler.repetition_penalty != 1.0:
        raise UserError(
            "speculative decoding samples without a repetition penalty; use plain decoding for it"
        )
    stops = set(stop_list(eos_id))
    block_size, stats = model.config.block_size, SpeculativeStats()
    cache = KVCache.allocate(
        model.config, 1, block_size, device=idx.device, dtype=next(model.parameters()).dtype
    )
    n = idx.shape[1]
    start = max(0, n - block_size)
    if n - 1 > start:  # the cache holds every window token but the last, which each round feeds first
        model(idx[:, start : n - 1], cache, last_only=True)
    while stats.new_tokens < max_new_tokens:
        room = min(k, block_size - (n - start), max_new_tokens - stats.new_tokens - 1)
        drafts, q = drafter.propose(idx, room, sampler) if room > 0 else ([], None)
        logits = model(torch.cat([idx[:, n - 1 :], idx.new_tensor([drafts])], dim=1), cache)[0]  # (1 + k, V)
        emitted = verify(logits, drafts, q, sampler)
        accepted = len(emitted) - 1  # the drafts kept; the last token is the target's own
        first_stop = next((i for i, token in enumerate(emitted) if token in stops), None)
        if first_stop is not None:
            emitted = emitted[: first_stop + 1]
        stats.target_forwards += 1
        stats.drafted += len(drafts)
        stats.accepted += min(accepted, len(emitted))  # drafts after a stop token are not kept
        idx = torch.cat([idx, idx.new_tensor([emitted])], dim=1)
        stats.new_tokens += len(emitted)
        for token in emitted:
            if on_token is not None:
                on_token(idx.new_tensor([token]))
        if first_stop is not None:
            break
        n = idx.shape[1]
        cache.rollback(n - 1 - start)  # keep the fed tokens that were accepted; the new last token is not fed
        drafter.keep(n - 1)
        new_start = context_start(start, n, block_size)
        if new_start != start:  # the window jumped, as it does in `generate`: re-encode the recent half
            start = new_start
            cache.reset()
            if n - 1 > start:
                model(idx[:, start : n - 1], cache, last_only=True)
    return idx, stats


def check_draft(target: GPT, draft: GPT, target_tokenizer_sha: str, draft_tokenizer_sha: str) -> None:
    """Refuse a draft that does not share the target's tokenizer and vocabulary, with one line."""
    if draft_tokenizer_sha != target_tokenizer_sha:
        raise UserError(
            "--draft checkpoint has a different tokenizer from --checkpoint; use a draft trained with the same "
            "tokenizer.json"
        )
    if draft.config.vocab_size != target.config.vocab_size:
        raise UserError(
            f"--draft vocab_size {draft.config.vocab_size} differs from --checkpoint vocab_size "
            f"{target.config.vocab_size}; use a draft with the target's vocabulary"
        )
