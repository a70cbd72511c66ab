"""The token cache: a second run does no work, a new tokenizer or changed file never reuses stale ids, and a
failed run leaves nothing a later run would trust."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import numpy as np
import pytest

from common.files import StagedFolder
from data import Tokenizer
from data.datamodule import TextDataModule
from data.store import META_FILE, publish_token_folder

VOCAB = 300


def _module(data_files: Path, cache_dir: Path, **overrides) -> TextDataModule:
    settings = {
        "dataset": "json",
        "data_files": str(data_files),
        "vocab_size": VOCAB,
        "block_size": 16,
        "cache_dir": str(cache_dir),
        **overrides,
    }
    module = TextDataModule(**settings)
    module.setup()
    return module


@pytest.fixture
def count_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every datasets.load_dataset call."""
    calls: list[str] = []
    real_load = datasets.load_dataset

    def counting_load(path: str, *args, **kwargs):
        calls.append(path)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", counting_load)
    return calls


def test_second_run_does_no_work(jsonl_corpus: Path, cache_dir: Path, count_loads: list[str]) -> None:
    first = _module(jsonl_corpus, cache_dir)
    meta = first.train_tokens.files[0].parent / META_FILE
    stamp = meta.stat().st_mtime_ns
    assert count_loads == ["json"]
    second = _module(jsonl_corpus, cache_dir)
    assert count_loads == ["json"], "a cache hit must not even load the dataset"
    assert meta.stat().st_mtime_ns == stamp
    assert np.array_equal(first.train_tokens, second.train_tokens)
    assert second.tokenizer.sha256 == first.tokenizer.sha256


def test_retrained_tokenizer_at_the_same_path_never_reuses_ids(
    jsonl_corpus: Path, documents: list[str], cache_dir: Path, tmp_path: Path
) -> None:
    tokenizer_file = tmp_path / "tokenizer.json"
    Tokenizer.train(documents, 300, show_progress=False).save(tokenizer_file)
    before = _module(jsonl_corpus, cache_dir, tokenizer_path=str(tokenizer_file), vocab_size=512)
    retrained = Tokenizer.train(documents, 450, show_progress=False)
    retrained.save(tokenizer_file)  # same path and same config: only the file's content changed
    after = _module(jsonl_corpus, cache_dir, tokenizer_path=str(tokenizer_file), vocab_size=512)
    assert after.tokenizer.sha256 == retrained.sha256 != before.tokenizer.sha256
    assert len(after.train_tokens) < len(before.train_tokens), "more merges, fewer tokens"
    assert after.train_tokens[:200].tolist() == retrained.encode(documents[0])[:200]
    assert after.tokenizer.decode(after.train_tokens.tolist()) == before.tokenizer.decode(
        before.train_tokens.tolist()
    )


def test_a_different_vocab_size_trains_a_new_tokenizer(jsonl_corpus: Path, cache_dir: Path) -> None:
    small = _module(jsonl_corpus, cache_dir, vocab_size=300)
    large = _module(jsonl_corpus, cache_dir, vocab_size=400)
    assert small.tokenizer.vocab_size == 300 and large.tokenizer.vocab_size == 400
    assert len(large.train_tokens) < len(small.train_tokens)


def test_editing_the_data_file_invalidates_the_cache(new_documents, corpus_file, cache_dir: Path) -> None:
    path = corpus_file("corpus.jsonl", new_documents(40, seed=5))
    before = _module(path, cache_dir)
    edited = new_documents(40, seed=6)
    corpus_file("corpus.jsonl", edited)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    after = _module(path, cache_dir)
    assert after.tokenizer.decode(after.train_tokens.tolist()).startswith(edited[0])
    assert not np.array_equal(before.train_tokens[:100], after.train_tokens[:100])


def test_two_processes_give_the_ids_of_one(new_documents, corpus_file, tmp_path: Path, monkeypatch) -> None:
    import data.tokenize_parts

    monkeypatch.setattr(data.tokenize_parts, "PART_BYTES", 4096)  # several parts from a small corpus
    path = corpus_file("parallel.jsonl", new_documents(60, seed=12))
    one = _module(path, tmp_path / "one", num_proc=1)
    two = _module(path, tmp_path / "two", num_proc=2)
    assert len(one.train_tokens.files) > 3
    assert np.array_equal(one.train_tokens, two.train_tokens)
    assert np.array_equal(one.val_tokens, two.val_tokens)


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


def test_prepare_command_builds_the_cache_fit_uses(
    jsonl_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import data.tokenize_parts
    from data.prepare import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "trainer:\n  max_steps: 3\nmodel:\n  n_layer: 2\n"
        f"data:\n  dataset: json\n  data_files: {jsonl_corpus}\n  vocab_size: {VOCAB}\n  block_size: 16\n",
        encoding="utf-8",
    )
    cache = tmp_path / "cache"
    argv = ["--config", str(config), "--data.cache_dir", str(cache), "--data.num_proc", "2"]
    monkeypatch.setattr("sys.argv", ["data.prepare", *argv])
    assert main() == 0
    assert "ready in" in capsys.readouterr().out
    monkeypatch.setattr(data.tokenize_parts, "tokenize_parts", None)  # any tokenization now fails loudly
    module = _module(jsonl_corpus, cache)  # what fit builds from the same data section
    assert cache in module.train_tokens.files[0].parents
    assert len(module.train_tokens) > 0


def test_prepare_command_refuses_a_bad_key_in_one_line(monkeypatch, capsys) -> None:
    from data.prepare import main

    monkeypatch.setattr("sys.argv", ["data.prepare", "--data.vocab_sise", "300"])
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "vocab_sise" in err


def test_publish_keeps_a_folder_another_process_published_first(tmp_path: Path) -> None:
    winner = tmp_path / "tokens-x"
    winner.mkdir()
    (winner / META_FILE).write_text("{}")
    with StagedFolder(tmp_path) as staged:
        (staged.path / META_FILE).write_text('{"loser": true}')
        assert publish_token_folder(staged, "tokens-x") == winner
    assert (winner / META_FILE).read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens-x"]


@pytest.mark.parametrize("part_bytes", [64 << 20, 3000])
def test_the_plan_counts_each_byte_of_text_once(monkeypatch, part_bytes: int) -> None:
    """The hold-out cuts one document in two; its bytes are shared between the splits, not counted twice
    (the progress line's total: tiny Shakespeare is one document)."""
    import data.tokenize_parts as plan

    monkeypatch.setattr(plan, "PART_BYTES", part_bytes)
    texts = ["x" * 10_000, "first line\nsecond line\n" * 400, "short"]
    docs = datasets.Dataset.from_dict({"text": texts})
    for corpus in (docs.select([1]), docs):  # one document; three, the cut inside the second
        result = plan.plan_parts(corpus, None, "text", "data.data_files", 0.5)
        counted = sum(part.text_bytes for part in result.train + result.val)
        assert counted == sum(len(text) for text in corpus["text"])


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
