"""benchmarks/shakespeare_budget.py: the schedule follows elapsed training time, evaluation is off the clock,
and the batched scoring equals scoring one window at a time."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks import shakespeare_budget
from benchmarks.shakespeare_budget import TimeBudget, score_validation
from model import GPT, ModelConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_trainer(max_steps: int = 1000):
    epoch_loop = types.SimpleNamespace(max_steps=max_steps)
    return types.SimpleNamespace(
        global_step=0, should_stop=False, fit_loop=types.SimpleNamespace(epoch_loop=epoch_loop)
    )


class FakeModule:
    model = "the model"

    def eval(self) -> None:
        self.training = False

    def train(self) -> None:
        self.training = True


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(shakespeare_budget.time, "perf_counter", fake)
    return fake


def run_steps(budget: TimeBudget, trainer, seconds_per_step: list[float], clock: FakeClock) -> list[int]:
    """Steps at the given durations; the max_steps the callback set after each one."""
    budget.on_train_start(trainer, None)
    plans = []
    for duration in seconds_per_step:
        clock.now += duration
        trainer.global_step += 1
        budget.on_train_batch_end(trainer, FakeModule(), None, None, 0)
        plans.append(trainer.fit_loop.epoch_loop.max_steps)
        if trainer.should_stop:
            break
    return plans


def test_schedule_progress_tracks_elapsed_time_when_the_speed_changes(clock):
    budget, trainer = TimeBudget(budget_s=10.0), fake_trainer()
    # 40 steps in the first 5 s, then twice as fast (durations exact in binary, so the sums are exact).
    plans = run_steps(budget, trainer, [0.125] * 40 + [0.0625] * 200, clock)
    assert plans[39] == 80  # 40 steps in 5 s of 10 s
    step_at_8s = 40 + 48  # 3 s at 0.0625 s per step
    assert plans[step_at_8s - 1] == 110  # 88 steps in 8 s of 10 s
    # The run stops at the budget, at the step where progress = step / max_steps reaches 1.
    assert trainer.should_stop and trainer.global_step == 120
    assert trainer.global_step / trainer.fit_loop.epoch_loop.max_steps == pytest.approx(1.0, abs=0.01)


def test_evaluation_time_is_off_the_clock_and_the_first_hit_is_reported(clock):
    losses = iter([2.5, 2.0, 1.87, 1.8, 1.7, 1.6])

    def evaluate(model) -> float:
        assert model == "the model"
        clock.now += 3.0  # slower than the steps: on the clock it would end the run early
        return next(losses)

    budget = TimeBudget(budget_s=6.0, evaluate=evaluate, every_s=1.0, target=1.88)
    trainer = fake_trainer()
    run_steps(budget, trainer, [0.5] * 100, clock)
    assert trainer.global_step == 12  # 6 s of 0.5 s steps, however long the evaluations took
    assert [round(s, 6) for s, _, _ in budget.evaluations] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert budget.time_to_target() == (3.0, 6)


def test_batched_scoring_equals_window_by_window():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()
    tokens = np.random.default_rng(0).integers(0, 64, 16 * 9 + 6, dtype=np.uint16)  # 9 full windows + a tail
    tokenizer = types.SimpleNamespace(decode=lambda ids: "ab" * len(ids))
    ids = torch.from_numpy(tokens.astype("int64"))
    expected = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, 16):
            window = ids[start : start + 17]
            logits = model(window[None, :-1])[0]
            expected += F.cross_entropy(logits, window[1:], reduction="sum").item()
    scores = score_validation(model, tokenizer, tokens, block_size=16, batch_size=4)
    assert scores["tokens"] == len(ids) - 1
    assert scores["nats_per_token"] * scores["tokens"] == pytest.approx(expected, rel=1e-5)
    assert scores["nats_per_char"] == pytest.approx(expected / (2 * (len(ids) - 1)), rel=1e-5)


class ArrayLike:
    """What the token cache's parts offer (np.asarray reads them), without numpy's array methods."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.tokens, dtype=dtype)

    def __len__(self) -> int:
        return len(self.tokens)


def test_the_score_takes_the_token_caches_parts_whole():
    # The benchmark scores data.val_tokens whole (the fit summary slices it first, which hid the difference).
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()
    tokens = np.random.default_rng(0).integers(0, 64, 40, dtype=np.uint16)
    tokenizer = types.SimpleNamespace(decode=lambda ids: "ab" * len(ids))
    assert score_validation(model, tokenizer, ArrayLike(tokens), 16) == score_validation(
        model, tokenizer, tokens, 16
    )
