"""What a newcomer sees from train.py: refused optimizer flags, help order, failures that leave nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from data import DataConfigError
from data.source import CorpusSource

pytestmark = pytest.mark.slow  # train.py runs in subprocesses here

ROOT = Path(__file__).resolve().parents[2]
# Unset so the download is really attempted (and fails on the refused connection, as without network).
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_SILENT")


def test_lightning_optimizer_flags_are_refused_with_the_model_keys(script):
    result = script("train.py", "fit", "--config", "configs/tiny.yaml", "--optimizer", "SGD", check=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--optimizer" in errors[0] and "model.learning_rate" in errors[0], (
        result.stderr
    )


def test_help_shows_the_project_sections_before_the_trainer_flags(script):
    out = script("train.py", "fit", "--help").stdout
    titles = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    order = [title.split(":")[0] for title in titles]
    for key in ("resume", "model", "data", "checkpoint", "samples", "attention_maps"):
        assert order.index(key) < order.index("trainer"), order
    assert out.index("--model.n_kv_head") < out.index("--trainer.accelerator")
    assert "runs/<run>" in out  # --ckpt_path documents the run-directory form
    assert "--optimizer" not in out and "--lr_scheduler" not in out


def free_port_url() -> str:
    """A URL on a local port nothing listens on: the connection is refused at once, as with no network."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/input.txt"


@pytest.mark.parametrize("source", ["missing-file", "unreachable-url"])
def test_a_run_that_fails_on_its_data_leaves_no_run_folder(source, tmp_path, data_cache):
    files = str(tmp_path / "nope.txt") if source == "missing-file" else free_port_url()
    root = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_SWITCHES}
    result = subprocess.run(
        [sys.executable, "train.py", "fit", "--config", "configs/tiny.yaml", "--data.data_files", files,
         "--data.cache_dir", str(tmp_path / "cache"), "--trainer.default_root_dir", str(root)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.data_files" in errors[0], result.stderr[-2000:]
    if source == "unreachable-url":
        assert "network" in errors[0] and files in errors[0]
    assert "wandb sync" not in result.stderr + result.stdout
    assert not root.exists() or not any(root.iterdir())


def test_a_run_that_fails_before_its_first_step_removes_the_run_folder_it_created(
    script, tiny_args, tmp_path
):
    # A missing checkpoint is found only after the wandb run and config.yaml were written (Lightning's setup).
    overrides = ["--trainer.logger", "true", "--ckpt_path", str(tmp_path / "nope.ckpt")]
    result = script(*tiny_args(tmp_path / "runs", *overrides), check=False)
    assert result.returncode != 0 and "nope.ckpt" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs" / "tiny").exists()


def test_an_unreachable_hub_names_the_network_and_the_local_file_keys(monkeypatch):
    monkeypatch.setattr("data.source.offline_reason", lambda: None)
    error = CorpusSource(dataset="someone/corpus")._load_error(
        ConnectionError("Couldn't reach 'someone/corpus'")
    )
    assert isinstance(error, DataConfigError)
    assert "network" in str(error) and "data.dataset=text" in str(error) and "data.data_files" in str(error)
