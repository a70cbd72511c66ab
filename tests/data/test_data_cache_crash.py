"""The token cache after a failure: a killed build resumes its finished parts, a kill -9 leaves no worker
and no temp file a later run would trust, and only dead builds' leftovers are swept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from common.files import StagedFolder
from data.store import META_FILE, publish_token_folder
from tests.data.test_data_cache import VOCAB, _module


def test_a_killed_build_resumes_without_redoing_finished_parts(
    new_documents, corpus_file, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import data.tokenize_parts

    monkeypatch.setattr(data.tokenize_parts, "PART_BYTES", 4096)
    path = corpus_file("killed.jsonl", new_documents(60, seed=13))
    real = data.tokenize_parts._tokenize_part
    done: list[str] = []
    first_run: list[str] = []

    def killed_after_three(part):
        if len(done) == 3 and not first_run:
            raise KeyboardInterrupt  # as a Ctrl-C or kill lands mid-build
        real(part)
        done.append(part.name)

    monkeypatch.setattr(data.tokenize_parts, "_tokenize_part", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        _module(path, cache_dir, num_proc=1)
    assert not list(cache_dir.rglob(META_FILE)), "no complete cache after a kill"
    assert sorted(p.name for p in cache_dir.rglob("*.bin")) == sorted(done) and len(done) == 3
    stamps = {p.name: p.stat().st_mtime_ns for p in cache_dir.rglob("*.bin")}
    first_run.extend(done)
    done.clear()
    resumed = _module(path, cache_dir, num_proc=1)
    assert done and not set(done) & set(first_run), "finished parts are kept, not tokenized again"
    for part in resumed.train_tokens.files:
        if part.name in stamps:
            assert part.stat().st_mtime_ns == stamps[part.name]
    monkeypatch.undo()
    monkeypatch.setattr(data.tokenize_parts, "PART_BYTES", 4096)
    straight = _module(path, cache_dir.parent / "straight", num_proc=1)
    assert np.array_equal(resumed.train_tokens, straight.train_tokens)
    assert np.array_equal(resumed.val_tokens, straight.val_tokens)


def test_publish_keeps_a_folder_another_process_published_first(tmp_path: Path) -> None:
    winner = tmp_path / "tokens-x"
    winner.mkdir()
    (winner / META_FILE).write_text("{}")
    with StagedFolder(tmp_path) as staged:
        (staged.path / META_FILE).write_text('{"loser": true}')
        assert publish_token_folder(staged, "tokens-x") == winner
    assert (winner / META_FILE).read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens-x"]


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads process states from /proc")
def test_a_kill_9_leaves_no_worker_and_its_rerun_publishes_no_temp_file(
    new_documents, corpus_file, cache_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    import subprocess
    import sys
    import time

    import data.tokenize_parts
    from data.prepare import main

    path = corpus_file("killed.jsonl", new_documents(60, seed=21))
    argv = ["--data.dataset", "json", "--data.data_files", str(path), "--data.vocab_size", str(VOCAB)]
    argv += ["--data.block_size", "16", "--data.cache_dir", str(cache_dir), "--data.num_proc", "2"]
    pids = tmp_path / "pids"
    pids.mkdir()
    script = Path(__file__).with_name("stuck_prepare.py")
    env = {**os.environ, "STUCK_PIDS_DIR": str(pids)}
    build = subprocess.Popen([sys.executable, str(script), *argv], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2 and build.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2, "both pool workers started a part"
    build.kill()  # SIGKILL of the main process alone: its workers are not signalled
    build.wait()
    deadline = time.monotonic() + 5
    while not all(map(_gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in workers if not _gone(pid)]
    for pid in alive:  # so that a failure leaves no stuck process behind
        os.kill(pid, 9)
    assert not alive, "orphaned workers exit within seconds of their parent's kill -9"
    assert [p for p in cache_dir.rglob("*") if ".partial-" in p.name], "the kill left temp files to sweep"

    monkeypatch.setattr(data.tokenize_parts, "PART_BYTES", 4096)
    monkeypatch.setattr("sys.argv", ["data.prepare", *argv])
    capsys.readouterr()
    assert main() == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    # The killed workers' temp files beside the staging folder are swept too (zombies here: nothing reaps them).
    assert not [p for p in cache_dir.rglob("*") if ".partial-" in p.name], "no temp file is left"
    published = Path(out.split("ready in ")[1].split(";")[0])
    names = sorted(p.name for p in published.iterdir())
    parts = [name for name in names if name.endswith(".bin")]
    assert names == sorted([*parts, META_FILE, "tokenizer.json"]), "nothing temporary is published"
    assert parts == sorted(
        json.loads((published / META_FILE).read_text())["parts"]["train"] + ["val-00000.bin"]
    )


def test_the_sweep_removes_only_dead_builds_of_this_host(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from data.store import sweep_data_cache

    corpus = tmp_path / "cache" / "text-corpus-0123"
    corpus.mkdir(parents=True)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    host = socket.gethostname()
    dead = corpus / f".staging.partial-{exited.pid}@{host}-abc123"
    live = corpus / f".staging.partial-{os.getpid()}@{host}-def456"
    elsewhere = corpus / f".staging.partial-{exited.pid}@another-node-0789"
    for folder in (dead, live, elsewhere):
        folder.mkdir()
        (folder / "train.bin").write_bytes(b"y" * 10)
    said: list[str] = []
    assert sweep_data_cache(tmp_path / "cache", said.append) == [dead]
    assert live.is_dir() and elsewhere.is_dir()
    assert len(said) == 1 and dead.name in said[0]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads process states from /proc")
def test_a_zombie_owner_has_exited(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    from data.store import sweep_data_cache

    corpus = tmp_path / "cache" / "text-corpus-0123"
    corpus.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until child.wait() below
    try:
        deadline = time.monotonic() + 60
        while not _gone(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"/proc/{child.pid}/stat").exists(), "the child is a zombie, not reaped"
        os.kill(child.pid, 0)  # a zombie still answers a signal: the check needs more than os.kill
        temp = corpus / f".train-00001.bin.partial-{child.pid}@{socket.gethostname()}-abc123"
        temp.write_bytes(b"x" * 10)
        assert sweep_data_cache(tmp_path / "cache", lambda _: None) == [temp]
        assert not temp.exists()
    finally:
        child.wait()
