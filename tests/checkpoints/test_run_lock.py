"""One writer per run directory: a second writer is refused in one line naming the holder; a kill -9'd holder
leaves nothing stuck; the start-up sweep waits for the lock, so it never removes a live writer's temp file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from checkpoints.run_dir import RunDir
from checkpoints.run_lock import RunDirBusyError, RunDirLock
from common.errors import EXIT_USER_ERROR
from common.files import TEMP_MARK

ROOT = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; from checkpoints.run_lock import RunDirLock; RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)"


def hold(run_dir: Path) -> subprocess.Popen:
    """Another process that holds the lock of `run_dir` (until killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_until_it_is_killed(tmp_path):
    holder = hold(tmp_path / "run")
    try:
        with pytest.raises(RunDirBusyError) as refused:
            RunDirLock(tmp_path / "run").acquire()
        assert f"process {holder.pid} " in str(refused.value) and "\n" not in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's lock: no stale-lock rule, the next writer proceeds at once.
    lock = RunDirLock(tmp_path / "run").acquire()
    assert f"process {os.getpid()} " in RunDir(tmp_path / "run").lock.read_text()
    lock.release()
    RunDirLock(tmp_path / "run").acquire().release()  # released: this process can take it again


SOCKET_CHECK = """
import sys
from multiprocessing.connection import Client, Listener
from checkpoints.run_lock import own_run_dir
lock = own_run_dir(sys.argv[1], say=lambda line: None)
with Listener(family="AF_UNIX") as listener:  # an address under multiprocessing's folder, as the workers use
    Client(listener.address).close()
    print(listener.address.startswith(str(lock.temp)))
lock.release()
"""


@pytest.mark.parametrize("system_temp", ["short", "long"])
def test_the_writers_temp_folder_takes_unix_sockets_for_a_deep_run_folder(tmp_path, system_temp):
    """DataLoader workers share tensors through a Unix socket under TMPDIR, whose path may not pass 107 bytes;
    a run folder's own tmp/ there made every multi-worker fit in a deep folder hang at its first batch. Where
    even the short run temp folder is too deep, multiprocessing's sockets stay in the system temp folder."""
    temp = Path(tempfile.mkdtemp(prefix="t-"))
    if system_temp == "long":  # room for multiprocessing's sockets, none for the run's folder in between
        temp = temp / ("x" * (70 - len(str(temp))))
        temp.mkdir()
    run_dir = tmp_path / ("deep-" * 12) / "runs" / "a-long-run-name"
    env = {**os.environ, "TMPDIR": str(temp)}
    done = subprocess.run([sys.executable, "-c", SOCKET_CHECK, str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.split() == [
        str(system_temp == "short")
    ]  # the sockets in the run's folder when they fit
    assert list(temp.iterdir()) == []  # the run's temp folder, and multiprocessing's, removed at exit
    shutil.rmtree(temp if system_temp == "short" else temp.parent)


def test_train_py_on_a_live_run_is_refused_and_sweeps_nothing_then_proceeds_once_its_owner_is_killed(
    tiny_args, script, tmp_path
):
    quiet = ["--trainer.logger", "false", "--samples.every_n_steps", "0", "--attention_maps.every_n_steps", "0",
             "--trainer.limit_val_batches", "0", "--trainer.max_steps", "4"]  # fmt: skip
    pause = {"class_path": "tests.training.pause_at_step.PauseAtStep", "init_args": {"step": 2}}
    live = subprocess.Popen(
        [sys.executable, *tiny_args(tmp_path, *quiet, f"--trainer.callbacks+={json.dumps(pause)}")], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert any("paused at step" in line for line in live.stdout), "the live run never paused"
        run_dir = RunDir(tmp_path / "tiny")
        # What the live run would be saving right now: a temporary file that names it.
        live_temp = (
            run_dir.checkpoints / f".step-00000002.ckpt{TEMP_MARK}{live.pid}@{socket.gethostname()}-0123abcd"
        )
        live_temp.parent.mkdir(parents=True, exist_ok=True)
        live_temp.write_bytes(b"half a checkpoint")
        for extra in ([], ["--ckpt_path", "last"]):  # a second fresh fit, and a resume
            result = script(*tiny_args(tmp_path, *quiet, *extra), check=False)
            errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
            assert result.returncode == EXIT_USER_ERROR and len(errors) == 1, result.stderr[-2000:]
            assert f"process {live.pid} " in errors[0] and "Traceback" not in result.stderr, errors[0]
            assert live_temp.exists(), "the refused start swept the live writer's temporary file"
    finally:
        live.send_signal(signal.SIGKILL)
        live.communicate(timeout=60)
    result = script(*tiny_args(tmp_path, *quiet, "--ckpt_path", "last"))
    assert not live_temp.exists() and live_temp.name in result.stderr  # swept now: its owner is dead
    assert (run_dir.checkpoints / "step-00000004.ckpt").is_file()
