"""Every bad data setting: a one-line DataConfigError that names the key, and nothing left in the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data import EOS_TOKEN, DataConfigError, Tokenizer
from data.datamodule import TextDataModule

VOCAB = 300
TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


def _raises(key: str, cache_dir: Path, cached_files, **settings) -> str:
    """Build (and if that passes, prepare) a module; return the error message after the shared checks."""
    settings = {"vocab_size": VOCAB, "block_size": 16, "cache_dir": str(cache_dir), **settings}
    with pytest.raises(DataConfigError) as caught:
        TextDataModule(**settings).setup()
    message = str(caught.value)
    assert message.startswith(f"{key}: "), message
    assert "\n" not in message
    assert cached_files(cache_dir) == [], "a failed run must leave nothing a later run could trust"
    # Nor an empty folder named after the bad input (`<cache>/text-image-<digest>/`), nor the cache it made.
    assert not cache_dir.exists(), list(cache_dir.rglob("*"))
    return message


def test_missing_data_file(cache_dir: Path, cached_files, tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    message = _raises("data.data_files", cache_dir, cached_files, data_files=str(missing))
    assert str(missing) in message and "does not exist" in message
    _raises(
        "data.data_files", cache_dir, cached_files, dataset="json", data_files=[str(tmp_path / "*.jsonl")]
    )


def test_hub_dataset_while_offline(cache_dir: Path, cached_files) -> None:
    # A Hub id ignores data_files (here a URL) instead of sending it to the Hub.
    message = _raises(
        "data.dataset",
        cache_dir,
        cached_files,
        dataset="karpathy/tiny_shakespeare",
        data_files=TINY_SHAKESPEARE_URL,
    )
    assert "offline" in message and "HF_HUB_OFFLINE=1" in message and "data.data_files" in message


def test_url_while_offline(cache_dir: Path, cached_files) -> None:
    message = _raises("data.data_files", cache_dir, cached_files, data_files=TINY_SHAKESPEARE_URL)
    assert "https://raw.githubusercontent.com/" in message and "offline" in message


def test_missing_text_column(jsonl_corpus: Path, cache_dir: Path, cached_files) -> None:
    message = _raises(
        "data.text_column",
        cache_dir,
        cached_files,
        dataset="json",
        data_files=str(jsonl_corpus),
        text_column="body",
    )
    assert "'body'" in message and "'text'" in message and "'id'" in message


def test_empty_corpus(tmp_path: Path, corpus_file, cache_dir: Path, cached_files) -> None:
    empty_file = tmp_path / "empty.txt"
    empty_file.write_text("")
    assert "is empty" in _raises("data.data_files", cache_dir, cached_files, data_files=str(empty_file))
    blank_documents = corpus_file("blank.jsonl", ["", "", ""])
    message = _raises(
        "data.data_files", cache_dir, cached_files, dataset="json", data_files=str(blank_documents)
    )
    assert "no text" in message


def test_train_split_is_required(corpus_file, documents: list[str], cache_dir: Path, cached_files) -> None:
    files = {"validation": str(corpus_file("val.jsonl", documents[:5]))}
    assert "'train'" in _raises("data.data_files", cache_dir, cached_files, dataset="json", data_files=files)


@pytest.mark.parametrize(
    ("key", "settings"),
    [
        ("data.vocab_size", {"vocab_size": 256}),
        ("data.block_size", {"block_size": 0}),
        ("data.batch_size", {"batch_size": 0}),
        ("data.val_fraction", {"val_fraction": 0.0}),
        ("data.val_fraction", {"val_fraction": 1.0}),
        ("data.num_proc", {"num_proc": 0}),
        ("data.num_workers", {"num_workers": -1}),
    ],
)
def test_bad_numbers_fail_at_construction(
    key: str, settings: dict, jsonl_corpus: Path, cache_dir: Path, cached_files
) -> None:
    _raises(key, cache_dir, cached_files, dataset="json", data_files=str(jsonl_corpus), **settings)


def test_validation_shorter_than_a_block(corpus_file, cache_dir: Path) -> None:
    tiny = corpus_file("tiny.jsonl", ["To be, or not to be, that is the question. " * 4])
    settings = {"dataset": "json", "data_files": str(tiny), "vocab_size": VOCAB, "cache_dir": str(cache_dir)}
    with pytest.raises(DataConfigError, match=r"^data\.block_size: ") as caught:
        TextDataModule(block_size=64, **settings).setup()
    assert "block_size=64" in str(caught.value) and "data.val_fraction" in str(caught.value)
    # The cache itself is complete and correct: a smaller block size uses it as it is.
    assert [path.name for path in cache_dir.rglob("meta.json")] == ["meta.json"]


def test_cached_tokens_too_short_for_a_larger_block(corpus_file, cache_dir: Path) -> None:
    tiny = corpus_file("tiny.jsonl", ["To be, or not to be, that is the question. " * 4])
    settings = {"dataset": "json", "data_files": str(tiny), "vocab_size": VOCAB, "cache_dir": str(cache_dir)}
    TextDataModule(block_size=4, **settings).setup()  # builds the cache
    with pytest.raises(DataConfigError, match=r"^data\.block_size: .*block_size=64"):
        TextDataModule(block_size=64, **settings).setup()  # the same cache, reused


def test_tokenizer_path_missing_or_too_large(
    tmp_path: Path, jsonl_corpus: Path, documents: list[str], cache_dir: Path, cached_files
) -> None:
    common = {"dataset": "json", "data_files": str(jsonl_corpus)}
    missing = str(tmp_path / "missing.json")
    assert missing in _raises(
        "data.tokenizer_path", cache_dir, cached_files, tokenizer_path=missing, **common
    )
    path = tmp_path / "tokenizer.json"
    Tokenizer.train(documents, 400, show_progress=False).save(path)
    message = _raises(
        "data.vocab_size", cache_dir, cached_files, tokenizer_path=str(path), vocab_size=300, **common
    )
    assert ">= 400" in message


def test_a_folder_of_files_is_read(tmp_path: Path, cache_dir: Path, shakespeare_text: str) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(shakespeare_text[:30_000], encoding="utf-8")
    (folder / "b.txt").write_text(shakespeare_text[30_000:60_000], encoding="utf-8")
    module = TextDataModule(data_files=str(folder), vocab_size=VOCAB, block_size=16, cache_dir=str(cache_dir))
    module.setup()
    text = module.tokenizer.decode(np.asarray(module.train_tokens).tolist())
    assert text.startswith(shakespeare_text[:1000]) and EOS_TOKEN in text, "both files, one document each"


def test_an_empty_folder_and_json_with_the_text_builder(
    tmp_path: Path, jsonl_corpus: Path, cache_dir: Path, cached_files
) -> None:
    (tmp_path / "empty").mkdir()
    assert "holds no files" in _raises(
        "data.data_files", cache_dir, cached_files, data_files=str(tmp_path / "empty")
    )
    message = _raises("data.dataset", cache_dir, cached_files, data_files=str(jsonl_corpus))
    assert "--data.dataset json" in message


def test_a_dataloader_workers_error_keeps_its_own_line(tmp_path: Path, corpus_file, cache_dir: Path) -> None:
    """torch re-raises a worker's error as "Caught DataConfigError in DataLoader worker process 1."."""
    files = {"train": str(corpus_file("one.jsonl", ["a single training document " * 20])),
             "validation": str(corpus_file("val.jsonl", ["held out " * 20]))}  # fmt: skip
    module = TextDataModule(dataset="json", data_files=files, streaming=True, num_workers=2, vocab_size=VOCAB,
                            block_size=4, batch_size=1, cache_dir=str(cache_dir), val_docs=1)  # fmt: skip
    module.setup()
    with pytest.raises(DataConfigError) as caught:
        for _ in zip(range(10), module.train_dataloader(), strict=False):  # reader 1 of 2 has no document
            pass
    message = str(caught.value)
    assert message.startswith("data.num_workers: stream reader 1 of 2") and "\n" not in message, message


@pytest.mark.parametrize("streaming", [False, True])
def test_a_binary_data_file_is_not_utf8_text(
    tmp_path: Path, cache_dir: Path, cached_files, streaming
) -> None:
    text, binary = tmp_path / "text.txt", tmp_path / "image.txt"
    text.write_text("a line of text\n" * 100)
    binary.write_bytes(b"\xff\xfe\x00\x81 bytes\n" * 100)  # a stream reaches it after the first file's lines
    settings = {"data_files": [str(text), str(binary)], "streaming": streaming, "text_sample_by": "line"}
    message = _raises("data.data_files", cache_dir, cached_files, **settings)
    assert f"{binary} is not UTF-8 text" in message


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("whose", ["there before", "being filled"])
def test_a_failed_load_keeps_a_corpus_folder_it_did_not_make_or_that_is_in_use(
    tmp_path: Path, cache_dir: Path, monkeypatch, streaming, whose
) -> None:
    binary = tmp_path / "image.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81 bytes\n" * 100)
    module = TextDataModule(vocab_size=VOCAB, block_size=16, cache_dir=str(cache_dir), data_files=str(binary),
                            streaming=streaming, text_sample_by="line")  # fmt: skip
    folder = module.settings.corpus_dir()
    if whose == "there before":
        folder.mkdir(parents=True)
    else:  # another process's file appears while this one loads
        load = type(module.source).load

        def load_while_another_writes(source):
            (folder / "theirs.json").write_text("{}")
            return load(source)

        monkeypatch.setattr(type(module.source), "load", load_while_another_writes)
    with pytest.raises(DataConfigError, match="is not UTF-8 text"):
        module.setup()
    assert folder.is_dir()
    assert [p.name for p in folder.iterdir()] == ([] if whose == "there before" else ["theirs.json"])


def test_a_cache_dir_that_cannot_be_created_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from data.prepare import main

    (tmp_path / "a-file").write_text("not a folder")
    for cache_dir in [
        tmp_path / "a-file" / "cache",
        *(["/proc/nope"] if Path("/proc/self").exists() else []),
    ]:
        with pytest.raises(DataConfigError, match=f"^data.cache_dir: cannot create {cache_dir}/"):
            TextDataModule(cache_dir=str(cache_dir)).setup()
        monkeypatch.setattr("sys.argv", ["data.prepare", "--data.cache_dir", str(cache_dir)])
        assert main() == 2
        err = capsys.readouterr().err
        assert err.startswith("error: data.cache_dir: cannot create") and err.count("\n") == 1, err


def test_prepare_without_a_config_or_data_flags_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    # It silently built the default corpus's cache.
    from data.prepare import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["data.prepare"])
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m data.prepare: pass --config") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text,words",
    [
        ("data: [\n  a: b", ['bad.yaml", line 1', "fix the YAML"]),  # malformed: named file, line
        ("- a list\n", ["bad.yaml: expected a train.py config"]),
        ("data:\n  bogus: 1\n", ["bad.yaml: data.bogus is not a key"]),
        (b"\xff\xfe", ["bad.yaml is not UTF-8 text"]),
    ],
    ids=["malformed", "not-a-mapping", "unknown-key", "binary"],
)
def test_prepare_a_bad_config_is_one_line(tmp_path: Path, monkeypatch, capsys, text, words) -> None:
    from data.prepare import main

    config = tmp_path / "bad.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    monkeypatch.setattr("sys.argv", ["data.prepare", "--config", str(config)])
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config") and err.count("\n") == 1, err
    assert all(word in err for word in words), err


def test_training_a_tokenizer_prints_no_blank_lines_into_a_log(capfd) -> None:
    Tokenizer.train(["to be or not to be " * 50] * 5, VOCAB)
    assert capfd.readouterr().out == ""


def test_prepare_help_shows_whole_sentences(capsys) -> None:
    """jsonargparse titles the data flags with the data module's first docstring line."""
    from data.prepare import parse

    with pytest.raises(SystemExit):
        parse(["--help"])
    title = TextDataModule.__doc__.splitlines()[0]
    assert title.endswith(".") and f"{title[:-1]}:" in capsys.readouterr().out  # a sentence, not a cut


def test_fit_names_the_data_key_typed_not_the_model_key_it_feeds(script) -> None:
    result = script("train.py", "fit", "--config", "configs/tiny.yaml", "--data.block_size", "0", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "error: data.block_size: must be positive, got 0"


def test_without_fork_one_process_tokenizes(tmp_path: Path, monkeypatch) -> None:
    """The tokenize workers inherit the documents by fork: elsewhere None picks one process, and more are refused."""
    from data.settings import PrepareSettings
    from data.source import CorpusSource

    monkeypatch.setattr("multiprocessing.get_all_start_methods", lambda: ["spawn"])
    settings = PrepareSettings(CorpusSource(data_files="x.txt"), tmp_path, 300)
    assert settings.num_procs(1 << 30) == 1
    with pytest.raises(DataConfigError, match=r"^data.num_proc: 2 processes need fork"):
        PrepareSettings(CorpusSource(data_files="x.txt"), tmp_path, 300, num_proc=2).num_procs(1 << 30)
