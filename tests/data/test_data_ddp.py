"""Streaming under DDP (2 CPU processes, gloo) through train.py: exact resume, and no data work at a barrier."""

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


def test_sigterm_and_resume_equal_a_straight_run_with_two_workers(new_documents, tmp_path: Path) -> None:
    files = _shards(tmp_path / "corpus", new_documents(400, seed=21, words_per_doc=60))
    cache, workers = tmp_path / "cache", ("--data.num_workers", "2")
    pause = {
        "class_path": "tests.training.pause_at_step.PauseAtStep",
        "init_args": {"step": STOP_AT, "timeout_s": 20},
    }
    args = _args(tmp_path / "stopped", files, cache, *workers, f"--trainer.callbacks+={json.dumps(pause)}")
    proc = _start(args, tmp_path / "stopped.log")
    cue = next((line for line in proc.stdout if "paused at step" in line), None)
    assert cue is not None, (tmp_path / "stopped.log").read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)  # to rank 0, which Lightning tells rank 1 at the next step
    proc.communicate(timeout=300)
    assert proc.returncode == 143, (tmp_path / "stopped.log").read_text()[-3000:]
    last = torch.load(tmp_path / "stopped" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == STOP_AT
    readers = last["TextDataModule"]["stream"]["readers"]
    assert sorted(readers) == [0, 1, 2, 3], "both ranks' two readers are in the checkpoint"
    _run(_args(tmp_path / "stopped", files, cache, *workers, "--ckpt_path", "last"), tmp_path / "resumed.log")
    _run(_args(tmp_path / "straight", files, cache, *workers), tmp_path / "straight.log")
    resumed, straight = _weights(tmp_path / "stopped"), _weights(tmp_path / "straight")
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), name


def test_data_preparation_longer_than_the_process_group_timeout(new_documents, tmp_path: Path) -> None:
    """Rank 0 trains the tokenizer for longer than the 40 s process-group timeout (shorter ones already fail the rendezvous on a loaded 2-core CPU); rank 1 waits on the file, not a barrier."""
    files = _shards(tmp_path / "corpus", new_documents(200, seed=22, words_per_doc=40))
    strategy = {
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {"timeout": "0:00:40", "process_group_backend": "gloo"},
    }
    args = _args(tmp_path / "runs", files, tmp_path / "cache", "--trainer.max_steps", "2")
    args[args.index("ddp")] = json.dumps(strategy)
    args[0] = str(Path(__file__).with_name("slow_tokenizer_train.py"))
    _run(args, tmp_path / "run.log", env={"SLOW_TOKENIZER_S": "70"})
    assert "waited" in (tmp_path / "run.log").read_text()
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
