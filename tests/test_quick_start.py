"""The README's quick start works offline from the repository, and nothing points outside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK_START = ["train.py", "fit", "--config", "configs/shakespeare.yaml"]
# Printed by the installed Lightning/wandb/torch on every run until train.py filtered them out.
NOISE = ("litlogger", "anonymous setting", "LeafSpec", "Epoch 0/-2")


@pytest.mark.slow
def test_readme_quick_start_trains_offline(tmp_path):
    assert " ".join(QUICK_START) in (ROOT / "README.md").read_text(encoding="utf-8")
    env = {**os.environ, "HOME": str(tmp_path / "home")}  # an empty home: no wandb login, no caches
    env.pop("WANDB_SILENT", None)
    env.pop("WANDB_MODE", None)  # no credentials must be enough to log offline
    result = subprocess.run(
        [sys.executable, *QUICK_START, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path / "runs"),
         "--data.cache_dir", str(tmp_path / "cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    run = tmp_path / "runs" / "shakespeare"
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()
    assert f"Upload later with: wandb sync {run / 'wandb'}/offline-run-" in output
    assert "step 2/2" in result.stdout  # plain progress lines when the output is not a terminal
    for noise in NOISE:
        assert noise not in output, noise


def test_nothing_in_the_repository_refers_to_the_shared_folder():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    needle = "../" + "shared"  # split so this file does not match itself
    found = subprocess.run(["git", "grep", "-n", "-F", needle], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1, found.stdout  # 1: no match
