"""benchmarks/explorer_size.py: the text it shows repeats itself, and the heads it names are the extremes."""

from __future__ import annotations

import torch

from benchmarks.explorer_size import repeated_text_ids, singled_out
from data import Tokenizer


def test_the_text_is_its_first_half_twice():
    tokenizer = Tokenizer.train(["First Citizen:\nBefore we proceed any further, hear me speak.\n"] * 50, 300)
    for tokens in (40, 41):
        ids = repeated_text_ids(tokenizer, tokens)[0].tolist()
        assert len(ids) == tokens
        assert ids[: tokens // 2] == ids[tokens // 2 : 2 * (tokens // 2)]
        assert len(set(ids)) > 5  # real text, not one repeated token


def test_the_named_heads_are_the_lowest_entropy_and_the_highest_scores():
    stats = {name: torch.zeros(3, 4) for name in ("entropy", "sink_mass", "previous_token", "induction")}
    stats["entropy"] += 5.0
    stats["entropy"][2, 1] = 0.1
    stats["induction"][1, 3] = 0.9
    lines = dict(line.strip().split(": ", 1) for line in singled_out(stats))
    assert lines["lowest entropy"].startswith("L2H1 0.10")
    assert lines["highest induction"].startswith("L1H3 0.90")
