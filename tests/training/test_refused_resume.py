"""A streaming resume refused after wandb started its segment (another data.num_workers than the checkpoint's
stream position) leaves the run folder as it was: no new segment, and wandb's `latest-run`, `debug.log` and
`debug-internal.log` links still point at the last real segment instead of dangling."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def folder_state(root: Path) -> dict[str, str]:
    """{relative path: what it is}: a link's target, a file's sha256, "dir". writer.lock's text is the pid of
    the last process that took the lock (checkpoints/run_lock.py): it must be there, whatever pid it names."""
    state = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if name == "writer.lock":
            state[name] = "lock"
        elif path.is_symlink():
            state[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            state[name] = "dir"
        else:
            state[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def test_a_refused_streaming_resume_leaves_the_run_folder_as_it_was(corpus, script, tiny_args, tmp_path):
    paragraphs = corpus.read_text(encoding="utf-8").split("\n\n")[:300]
    stream = tmp_path / "stream.jsonl"
    stream.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs), encoding="utf-8")
    streaming = ["--data.dataset", "json", "--data.data_files", str(stream), "--data.streaming", "true"]
    streaming += ["--data.tokenizer_train_docs", "40", "--data.val_docs", "30"]
    script(*tiny_args(tmp_path / "runs", *streaming, "--trainer.max_steps", "2"))
    run_dir = tmp_path / "runs" / "tiny"
    before = folder_state(run_dir)
    assert before["wandb/latest-run"].startswith("-> offline-run-")

    result = script(
        "train.py", "fit", "--ckpt_path", str(run_dir), "--trainer.max_steps", "4", "--data.num_workers", "2",
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.num_workers" in errors[0] and "Traceback" not in result.stderr
    assert folder_state(run_dir) == before
