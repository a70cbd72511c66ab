"""SIGTERM mid-run: last.ckpt saved at the step the message names, exit 143, resume equals a straight run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CUE = "paused at step"  # printed by pause_at_step.PauseAtStep (a subprocess, so not imported here)
MAX_STEPS, STOP_AT = 12, 5
# Periodic saving is off (its interval is beyond max_steps): only the SIGTERM handler can write last.ckpt.
QUIET = ["--trainer.logger", "false", "--samples.every_n_steps", "0", "--attention_maps.every_n_steps", "0",
         "--trainer.max_steps", str(MAX_STEPS), "--checkpoint.every_n_train_steps", "1000",
         "--trainer.limit_val_batches", "0"]  # fmt: skip


def final_weights(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    return ckpt["state_dict"]


# Who receives the SIGTERM, and the data loading it meets: the process alone (`kill PID`), or its whole process
# group as SLURM and Kubernetes send it, DataLoader workers and a streaming loader's workers included.
STOPS = {
    "process": (False, []),
    "group, 2 workers": (True, ["--data.num_workers", "2"]),
    "group, streaming, 2 workers": (
        True,
        [
            "--data.num_workers",
            "2",
            "--data.streaming",
            "true",
            "--data.text_sample_by",
            "paragraph",
            "--data.val_docs",
            "50",
        ],
    ),
}


@pytest.mark.parametrize(("group", "data"), STOPS.values(), ids=STOPS.keys())
def test_sigterm_saves_then_resume_matches_uninterrupted(script, tiny_args, tmp_path, group, data):
    pause = {"class_path": "tests.training.pause_at_step.PauseAtStep", "init_args": {"step": STOP_AT}}
    args = tiny_args(tmp_path / "stopped", *QUIET, *data, f"--trainer.callbacks+={json.dumps(pause)}")
    # stderr goes to a file, so a chatty stderr cannot fill its pipe and block the run.
    with open(tmp_path / "stderr.txt", "w+") as stderr_file:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr_file,
                                text=True, env=dict(os.environ), start_new_session=group)  # fmt: skip
        cue = next((line for line in proc.stdout if CUE in line), None)
        assert cue is not None, "training never paused:\n" + (tmp_path / "stderr.txt").read_text()[-2000:]
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    assert proc.returncode == 143, stderr[-2000:]
    reported = re.search(r"SIGTERM\b.*\bstep (\d+)", stderr)
    assert reported is not None, stderr[-2000:]
    last = tmp_path / "stopped" / "tiny" / "checkpoints" / "last.ckpt"
    assert int(reported[1]) == STOP_AT == torch.load(last, weights_only=True)["global_step"]

    assert "Traceback" not in stderr, stderr[-2000:]
    script(*tiny_args(tmp_path / "stopped", *QUIET, *data, "--ckpt_path", "last"))
    script(*tiny_args(tmp_path / "straight", *QUIET, *data))
    resumed = final_weights(tmp_path / "stopped" / "tiny")
    straight = final_weights(tmp_path / "straight" / "tiny")
    assert straight.keys() == resumed.keys()
    for name, tensor in straight.items():
        assert torch.equal(tensor, resumed[name]), name
