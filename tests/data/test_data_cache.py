"""The token cache: a second run does no work, a new tokenizer or changed file never reuses stale ids, the
prepare command builds what fit uses, and the plan counts each byte once (after failures: test_data_cache_crash.py)."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np
import pytest

from data import Tokenizer
from data.datamodule import TextDataModule
from data.store import META_FILE

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


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


DAMAGE = {  # file of the built folder -> what happens to it
    "truncated meta.json": (META_FILE, _truncate),
    "meta.json not an object": (META_FILE, lambda path: path.write_text("[1, 2]")),
    "missing meta.json": (META_FILE, os.remove),
    "truncated train part": ("train-00000.bin", _truncate),
    "zeroed val part": ("val-00000.bin", _zero),
    "missing tokenizer.json": ("tokenizer.json", os.remove),
    "zeroed tokenizer.json": ("tokenizer.json", _zero),
    "streaming: zeroed val.bin": ("val.bin", _zero),
    "streaming: truncated heldout.json": ("heldout.json", _truncate),
}


@pytest.mark.parametrize(("name", "damage"), DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_cache_file_is_one_line_naming_it(
    jsonl_corpus: Path, cache_dir: Path, name, damage
) -> None:
    from data import DataConfigError

    streaming = name in ("val.bin", "heldout.json")
    kind = {"streaming": True, "val_docs": 5} if streaming else {}
    folder = _module(jsonl_corpus, cache_dir, **kind).val_tokens.files[0].parent
    damage(folder / name)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(DataConfigError) as error:
        _module(jsonl_corpus, cache_dir, **kind)
    message = str(error.value)
    assert message.startswith(f"{folder / name}: the data cache is damaged") and "\n" not in message, message
    assert f"remove {folder} and run again" in message
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before  # nothing rewritten
