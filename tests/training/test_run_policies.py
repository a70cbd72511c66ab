"""Policies a run follows: the thread count (common/threads.py), the samples table's state and seeds, the schedule note."""

from __future__ import annotations

import pytest

from common.errors import UserError
from common.threads import OMP_ENV, apply_thread_count, busy_note, pick_thread_count
from training.samples import SampleGenerations


@pytest.fixture(autouse=True)
def no_omp_env(monkeypatch):
    monkeypatch.delenv(OMP_ENV, raising=False)


@pytest.mark.parametrize(("cpus", "load", "expected"), [(2, 0.0, 2), (2, 2.1, 1), (16, 5.4, 11), (4, 9.0, 1)])
def test_default_is_the_free_cpus(cpus, load, expected):
    assert pick_thread_count(None, cpus=cpus, load=load)[0] == expected


def test_explicit_count_then_omp_env_come_first(monkeypatch):
    assert pick_thread_count(3, cpus=2, load=5.0)[0] == 3
    monkeypatch.setenv(OMP_ENV, "5")
    assert pick_thread_count(None, cpus=2, load=5.0)[0] == 5
    with pytest.raises(UserError, match="--threads"):
        pick_thread_count(0)


def test_apply_sets_the_count_and_says_why():
    chosen = []
    threads, line = apply_thread_count(2, chosen.append)
    assert chosen == [threads] == [2] and line.startswith("threads: 2 (--threads")


def test_busy_note_only_when_oversubscribed():
    assert busy_note(2, cpus=2, load=1.9) is None
    note = busy_note(2, cpus=2, load=4.2)
    assert note is not None and "load 4.2 on 2 CPUs" in note


def test_samples_rows_round_trip_through_the_checkpoint_state():
    before = SampleGenerations()
    before.rows = [[4, "ROMEO:", " and"], [8, "ROMEO:", " so"]]
    after = SampleGenerations()
    after.load_state_dict(before.state_dict())
    assert after.rows == before.rows


def test_each_prompt_and_step_samples_with_its_own_reproducible_seed():
    samples = SampleGenerations(seed=0)
    seeds = {samples.sample_seed(step, index) for step in (250, 500) for index in range(3)}
    assert len(seeds) == 6
    assert samples.sample_seed(250, 1) == SampleGenerations(seed=0).sample_seed(250, 1)
    assert samples.sample_seed(250, 1) != SampleGenerations(seed=1).sample_seed(250, 1)


def test_a_sample_stops_at_any_stop_id_and_an_empty_prompt_starts_at_the_separator(monkeypatch):
    # Two stop ids, as Qwen Instruct lists: the row ends at the second one, the first one never produced.
    import types

    import torch

    import training.samples
    from data.tokenizer import Tokenizer, TokenRules

    base = Tokenizer.train(["to be or not to be, that is the question"] * 20, vocab_size=300)
    words = base.encode(" to be")
    second_stop = base.encode("q")[0]
    tokenizer = Tokenizer(base._backend, TokenRules((base.eos_id, second_stop)))
    seen = {}

    def fake_generate(model, ids, max_new_tokens, *, eos_id, **kwargs):
        seen["prompt"], seen["eos_id"] = ids[0].tolist(), eos_id
        return torch.cat([ids, torch.tensor([[*words, second_stop, *words]])], dim=1)

    monkeypatch.setattr(training.samples, "generate", fake_generate)
    module = types.SimpleNamespace(device=torch.device("cpu"), model=None)
    text = SampleGenerations()._continue(module, tokenizer, "", seed=0)
    assert text == tokenizer.decode(words) == " to be"
    assert seen["prompt"] == [tokenizer.eos_id] and tuple(seen["eos_id"]) == tokenizer.eos_ids


def test_extending_a_finished_wsd_run_says_the_learning_rate_goes_back_up():
    from training.schedule import schedule_change_note

    shape = dict(peak_lr=3e-3, warmup_steps=50, schedule="wsd", min_lr_ratio=0.05, decay_fraction=0.3)
    note = schedule_change_note(3500, 3500, 7000, **shape)
    assert note is not None and "3500 -> 7000" in note and "from 0.00015 to 0.003" in note, note
    assert schedule_change_note(3500, 3500, 3500, **shape) is None
    assert schedule_change_note(3500, 3500, 7000, **{**shape, "schedule": "constant"}) is None


@pytest.mark.parametrize(("block_size", "refused"), [(64, False), (65, True)])
def test_init_from_takes_a_data_block_size_up_to_exactly_the_models_context(block_size, refused):
    # The boundary itself: a block as long as the pretrained context fits; one token more does not.
    from jsonargparse import Namespace

    from model import ModelConfig
    from training.init_from import Pretrained, _check_data_keys

    pretrained = Pretrained(source=None, config=ModelConfig(vocab_size=300, block_size=64), tokenizer=None)
    data = Namespace(block_size=block_size, tokenizer_path=None)
    if not refused:
        _check_data_keys("tiny", pretrained, {}, data)
        return
    with pytest.raises(UserError, match="data.block_size=65 is longer than the 64-token context"):
        _check_data_keys("tiny", pretrained, {}, data)


def test_the_thread_policy_counts_the_cpus_this_process_may_run_on(monkeypatch):
    # A container or `taskset` allowing 1 CPU of a 16-CPU machine: 1 thread, not 16 minus the load.
    import common.threads as threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert pick_thread_count(None) == (1, "1 CPUs, load 0.0")
