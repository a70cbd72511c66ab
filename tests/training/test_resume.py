"""Exact resume and non-finite-loss policies, in process (no wandb, no progress bar)."""

from __future__ import annotations

import hashlib

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data.datamodule import TextDataModule
from training import LitGPT, NonFiniteLossError

MODEL = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, warmup_steps=2, learning_rate=3e-3)


class StopAt(L.Callback):
    """Ends fit() after `step` optimizer steps, as an interruption would, keeping max_steps (the schedule)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs:  # empty: the step was skipped
            self.losses[trainer.global_step] = outputs["loss"].item()


class NaNAt(LitGPT):
    """A LitGPT whose loss is NaN on one optimizer step."""

    def __init__(self, bad_step: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad_step = bad_step

    def loss(self, x, y):
        loss = super().loss(x, y)
        return loss * float("nan") if self.trainer.global_step == self.bad_step else loss


def fit(
    corpus,
    cache,
    root,
    max_steps,
    stop_at=None,
    ckpt_path=None,
    model=None,
    callbacks=(),
    data=None,
    **trainer,
):
    """One fit() call with a checkpoint every step; returns (module, recorded losses).

    `data` replaces the text data module of `corpus`; `trainer` overrides Trainer arguments (validation is off).
    """
    recorder = LossRecorder()
    callbacks = [
        recorder,
        *callbacks,
        ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, every_n_train_steps=1, save_top_k=0),
    ]
    if stop_at is not None:
        callbacks.append(StopAt(stop_at))
    trainer = L.Trainer(**{
        "default_root_dir": root, "max_steps": max_steps, "max_epochs": -1, "accelerator": "cpu", "devices": 1,
        "logger": False, "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
        "num_sanity_val_steps": 0, "gradient_clip_val": 1.0, "callbacks": callbacks, **trainer,
    })  # fmt: skip
    data = data or TextDataModule(
        data_files=str(corpus), cache_dir=str(cache), vocab_size=384, block_size=32, batch_size=8
    )
    torch.manual_seed(0)  # the same initial weights in every run
    module = model or LitGPT(vocab_size=384, block_size=32, **MODEL)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return module, recorder.losses


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("segments", [(4, 8), (3, 5, 8)], ids=["resumed-once", "resumed-twice"])
def test_resume_reproduces_the_uninterrupted_run_exactly(corpus, data_cache, tmp_path, segments):
    straight, straight_losses = fit(corpus, data_cache, tmp_path / "straight", max_steps=8)
    losses, ckpt = {}, None
    for stop in segments:
        resumed, part = fit(
            corpus, data_cache, tmp_path / "resumed", max_steps=8, stop_at=stop, ckpt_path=ckpt
        )
        losses |= part
        ckpt = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    assert sorted(losses) == list(range(1, 9))
    assert losses == straight_losses  # tolerance 0: same batches, same ops, same optimizer state
    assert_same_weights(straight, resumed)


def test_nonfinite_loss_raise_stops_and_keeps_the_last_good_checkpoint(corpus, data_cache, tmp_path):
    last = tmp_path / "checkpoints" / "last.ckpt"
    seen = {}

    class Snapshot(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 3:
                seen["digest"] = hashlib.sha256(last.read_bytes()).hexdigest()

    model = NaNAt(3, vocab_size=384, block_size=32, **MODEL)
    with pytest.raises(NonFiniteLossError, match="step 3"):
        fit(corpus, data_cache, tmp_path, max_steps=6, model=model, callbacks=[Snapshot()])
    assert hashlib.sha256(last.read_bytes()).hexdigest() == seen["digest"]
    assert torch.load(last, weights_only=True)["global_step"] == 3


def test_nonfinite_loss_skip_counts_and_continues(corpus, data_cache, tmp_path):
    model = NaNAt(3, vocab_size=384, block_size=32, nonfinite_loss="skip", **MODEL)
    fit(corpus, data_cache, tmp_path, max_steps=6, model=model)
    assert model.skipped_batches == 1
    assert model.trainer.global_step == 6  # Lightning counts the skipped step: 5 updates, 6 batches, 6 steps
    assert all(torch.isfinite(p).all() for p in model.parameters())
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["gqa_gpt"]["skipped_batches"] == 1


def test_last_checkpoint_is_written_when_training_ends_between_saves(corpus, data_cache, tmp_path):
    from training import LastCheckpoint

    trainer = L.Trainer(
        max_steps=7, max_epochs=-1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=5, save_top_k=0),
                   LastCheckpoint()],
    )  # fmt: skip
    data = TextDataModule(
        data_files=str(corpus), cache_dir=str(data_cache), vocab_size=384, block_size=32, batch_size=8
    )
    trainer.fit(LitGPT(vocab_size=384, block_size=32, **MODEL), data)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 7


def test_resume_after_a_skipped_step_continues_with_the_right_batches(corpus, data_cache, tmp_path):
    torch.manual_seed(0)
    straight = NaNAt(2, vocab_size=384, block_size=32, nonfinite_loss="skip", **MODEL)
    _, straight_losses = fit(corpus, data_cache, tmp_path / "straight", max_steps=6, model=straight)
    torch.manual_seed(0)
    first = NaNAt(2, vocab_size=384, block_size=32, nonfinite_loss="skip", **MODEL)
    _, losses = fit(corpus, data_cache, tmp_path / "resumed", max_steps=6, stop_at=4, model=first)
    resumed = NaNAt(2, vocab_size=384, block_size=32, nonfinite_loss="skip", **MODEL)
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    _, rest = fit(corpus, data_cache, tmp_path / "resumed", max_steps=6, ckpt_path=last, model=resumed)
    assert resumed.skipped_batches == 1
    assert losses | rest == straight_losses
    assert_same_weights(straight, resumed)
