"""The lines a finished fit prints: the final val/loss, the score of the validation text, how to sample."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch

from common.errors import UserError
from data.datamodule import TextDataModule
from training import LitGPT
from training.fit_summary import LOGITS_BUDGET_BYTES, FitSummary, score_validation, windows_per_batch

MODEL = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, warmup_steps=1, learning_rate=3e-3)


def fit(corpus, cache, root, limit_val_batches, summary=None, every=3) -> tuple[LitGPT, TextDataModule]:
    trainer = L.Trainer(
        default_root_dir=root, max_steps=3, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=limit_val_batches, val_check_interval=every, num_sanity_val_steps=0,
        callbacks=[summary or FitSummary()],
    )  # fmt: skip
    data = TextDataModule(
        data_files=str(corpus), cache_dir=str(cache), vocab_size=384, block_size=32, batch_size=4
    )
    torch.manual_seed(0)
    module = LitGPT(vocab_size=384, block_size=32, **MODEL)
    trainer.fit(module, data)
    return module, data


# val_check_interval 3 validates the last step anyway; 5 would not, but the last step always validates.
@pytest.mark.parametrize("every", [3, 5])
def test_the_summary_scores_the_validation_text_with_the_final_weights(
    corpus, data_cache, tmp_path, capsys, every
):
    module, data = fit(corpus, data_cache, tmp_path, limit_val_batches=2, every=every)
    out = capsys.readouterr().out
    assert re.search(r"finished step 3/3 \| val/loss [0-9.]+ \(nats/token, 2 batches\)", out)
    module.eval()
    expected = score_validation(module.model, data.tokenizer, data.val_tokens[:], data.block_size)
    line = next(line for line in out.splitlines() if line.startswith("validation text"))
    assert f"all of it: {expected['chars']:,} characters" in line
    assert f"{expected['nats_per_char']:.4f} nats/char, {expected['bpb']:.4f} bits/byte" in line
    assert f"sample from it: python generate.py --checkpoint {tmp_path}" in out


def test_no_validation_means_no_scoring_of_its_text(corpus, data_cache, tmp_path, capsys):
    fit(corpus, data_cache, tmp_path, limit_val_batches=0)
    out = capsys.readouterr().out
    assert "finished step 3/3" in out and "validation text" not in out
    assert "sample from it" in out


def test_score_tokens_bounds_the_score_which_shows_its_progress(corpus, data_cache, tmp_path, capsys):
    module, data = fit(corpus, data_cache, tmp_path, limit_val_batches=2, summary=FitSummary(max_tokens=1000))
    out, err = capsys.readouterr()
    module.eval()
    expected = score_validation(module.model, data.tokenizer, data.val_tokens[:1000], data.block_size)
    line = next(line for line in out.splitlines() if line.startswith("validation text"))
    assert f"its first 1,000 of {len(data.val_tokens):,} tokens" in line
    assert f"{expected['nats_per_char']:.4f} nats/char" in line
    assert "scoring the validation text: 1,000 tokens (score_tokens bounds it)" in err
    assert err.count("  scored ") == 1  # 31 windows in one forward: done at once, one progress line


def test_progress_comes_after_each_forward_and_ends_at_the_total(corpus, data_cache, tmp_path):
    module, data = fit(corpus, data_cache, tmp_path, limit_val_batches=0)
    seen = []
    score_validation(module.model.eval(), data.tokenizer, data.val_tokens[:321], 32, batch_size=4,
                     progress=lambda done, total: seen.append((done, total)))  # fmt: skip
    assert seen == [(4, 10), (8, 10), (10, 10)]


def test_a_negative_score_tokens_is_refused():
    with pytest.raises(UserError, match="score_tokens"):
        FitSummary(max_tokens=-1)


@pytest.mark.parametrize(("block_size", "vocab_size"), [(1024, 50304), (256, 49152), (32, 384)])
def test_a_scoring_batch_of_logits_stays_within_its_budget(block_size, vocab_size):
    windows = windows_per_batch(block_size, vocab_size)
    assert windows >= 1
    assert windows == 1 or windows * block_size * vocab_size * 4 <= LOGITS_BUDGET_BYTES
    assert (windows + 1) * block_size * vocab_size * 4 > LOGITS_BUDGET_BYTES  # the most that fit
