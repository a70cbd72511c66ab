"""Streaming under DDP (2 CPU processes, gloo) through train.py: exact resume after SIGTERM and kill -9, and no
data work at a barrier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, TEST_ENV

pytestmark = pytest.mark.slow
MAX_STEPS, STOP_AT = 8, 4
WORKERS = ("--data.num_workers", "2")
COLLECTIVE_TIMEOUT_S = 5


def _shards(folder: Path, documents: list[str]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(2):
        rows = [json.dumps({"text": doc}) + "\n" for i, doc in enumerate(documents) if i % 2 == index]
        (folder / f"shard-{index}.jsonl").write_text("".join(rows), encoding="utf-8")
    return json.dumps([str(folder / f"shard-{index}.jsonl") for index in range(2)])


def _args(root: Path, files: str, cache: Path, *extra: str) -> list[str]:
    return [
        "train.py", "fit", "--config", "configs/tiny.yaml", "--data.dataset", "json", "--data.data_files", files,
        "--data.streaming", "true", "--data.tokenizer_train_docs", "40", "--data.val_docs", "10",
        "--data.cache_dir", str(cache), "--data.block_size", "32", "--data.batch_size", "4",
        "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "false", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_steps", str(MAX_STEPS), "--trainer.limit_val_batches", "0",
        "--checkpoint.every_n_train_steps", "1000", "--samples.every_n_steps", "0",
        "--attention_maps.every_n_steps", "0", *extra,
    ]  # fmt: skip


def _start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        env={**os.environ, **TEST_ENV, **(env or {})}, start_new_session=True,
    )  # fmt: skip


def _run(args: list[str], log: Path, env: dict | None = None) -> None:
    proc = _start(args, log, env)
    proc.communicate(timeout=600)
    assert proc.returncode == 0, log.read_text()[-3000:]


def _weights(run: Path) -> dict:
    ckpt = torch.load(run / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    return ckpt["state_dict"]


@pytest.fixture(scope="module")
def corpus(new_documents, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _shards(tmp_path_factory.mktemp("corpus"), new_documents(400, seed=21, words_per_doc=60))


@pytest.fixture(scope="module")
def straight(corpus: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted 2-process, 2-worker run every interrupted one must reproduce (weights at MAX_STEPS)."""
    root = tmp_path_factory.mktemp("straight")
    _run(_args(root / "runs", corpus, root / "cache", *WORKERS), root / "straight.log")
    return _weights(root / "runs")


def _pause_at(step: int) -> str:
    pause = {
        "class_path": "tests.training.pause_at_step.PauseAtStep",
        "init_args": {"step": step, "timeout_s": 60},
    }
    return f"--trainer.callbacks+={json.dumps(pause)}"


def _wait_for_cue(proc: subprocess.Popen, log: Path) -> None:
    cue = next((line for line in proc.stdout if "paused at step" in line), None)
    assert cue is not None, log.read_text()[-3000:]


def _assert_same_weights(resumed: dict, straight: dict) -> None:
    assert resumed.keys() == straight.keys()
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), name


def test_sigterm_and_resume_equal_a_straight_run_with_two_workers(corpus, straight, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = _start(
        _args(tmp_path / "stopped", corpus, cache, *WORKERS, _pause_at(STOP_AT)), tmp_path / "stopped.log"
    )
    _wait_for_cue(proc, tmp_path / "stopped.log")
    proc.send_signal(signal.SIGTERM)  # to rank 0, which Lightning tells rank 1 at the next step
    proc.communicate(timeout=300)
    assert proc.returncode == 143, (tmp_path / "stopped.log").read_text()[-3000:]
    last = torch.load(tmp_path / "stopped" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == STOP_AT
    readers = last["TextDataModule"]["stream"]["readers"]
    assert sorted(readers) == [0, 1, 2, 3], "both ranks' two readers are in the checkpoint"
    _run(
        _args(tmp_path / "stopped", corpus, cache, *WORKERS, "--ckpt_path", "last"), tmp_path / "resumed.log"
    )
    _assert_same_weights(_weights(tmp_path / "stopped"), straight)


def test_kill_9_after_a_checkpoint_and_resume_equal_a_straight_run(corpus, straight, tmp_path: Path) -> None:
    """SIGKILL to the whole job (both ranks and their workers) mid-run, one step after a periodic checkpoint."""
    cache, saved_at = tmp_path / "cache", STOP_AT - 1
    every = ("--checkpoint.every_n_train_steps", str(saved_at))
    log = tmp_path / "killed.log"
    proc = _start(_args(tmp_path / "killed", corpus, cache, *WORKERS, *every, _pause_at(STOP_AT)), log)
    _wait_for_cue(proc, log)  # the checkpoint of step saved_at was written before step STOP_AT ran
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    last = torch.load(tmp_path / "killed" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == saved_at
    _run(
        _args(tmp_path / "killed", corpus, cache, *WORKERS, *every, "--ckpt_path", "last"),
        tmp_path / "resumed.log",
    )
    _assert_same_weights(_weights(tmp_path / "killed"), straight)


def test_data_preparation_longer_than_the_process_group_timeout(new_documents, tmp_path: Path) -> None:
    """Rank 0 trains the tokenizer for 4x the 5 s collective timeout; rank 1 waits on its file, not a barrier.

    The rendezvous keeps the default timeout (tests/data/collective_timeout.py): on a loaded 2-core machine the
    two processes can start further apart than 5 s, which would fail before any data work.
    """
    files = _shards(tmp_path / "corpus", new_documents(200, seed=22, words_per_doc=40))
    strategy = {
        "class_path": "tests.data.collective_timeout.CollectiveTimeoutDDP",
        "init_args": {"collective_timeout_s": COLLECTIVE_TIMEOUT_S, "process_group_backend": "gloo"},
    }
    args = _args(tmp_path / "runs", files, tmp_path / "cache", "--trainer.max_steps", "2")
    args[args.index("ddp")] = json.dumps(strategy)
    args[0] = str(Path(__file__).with_name("slow_tokenizer_train.py"))
    _run(args, tmp_path / "run.log", env={"SLOW_TOKENIZER_S": str(4 * COLLECTIVE_TIMEOUT_S)})
    assert "waited" in (tmp_path / "run.log").read_text()
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
