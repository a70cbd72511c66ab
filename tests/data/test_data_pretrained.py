"""The data module with a pretrained model's tokenizer (train.py's model.init_from): no BPE is trained, the
token cache is keyed by that tokenizer's sha256 (rules included), documents are separated by its EOS id and
start with its BOS id when its rule adds one (once per document, not once per tokenized segment)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data.datamodule import TextDataModule
from data.tokenizer import Tokenizer, TokenRules
from tests.interop.conftest import llama2_backend, save_llama

EOS, BOS = 2, 1
# The second document is long enough to be cut into several segments (data.documents.SEGMENT_CHARS).
DOCS = ["the cat sat on the mat", "\n".join(["héllo wörld naïve"] * 1500), "don't 🙂 stop"]
VAL = ["the mat sat", "wörld cat"]


def llama_tokenizer(add_bos: bool = True) -> Tokenizer:
    return Tokenizer(llama2_backend(), TokenRules((EOS, 3), BOS, add_bos))


def write_corpus(folder) -> dict[str, str]:
    files = {}
    for split, docs in (("train", DOCS), ("validation", VAL)):
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
        files[split] = str(path)
    return files


def expected(tokenizer: Tokenizer, docs: list[str]) -> list[int]:
    ids: list[int] = []
    for index, doc in enumerate(docs):
        ids += ([EOS] if index else []) + tokenizer.encode(doc)  # encode adds the BOS by the model's rule
    return ids


def prepared(tmp_path, tokenizer: Tokenizer) -> TextDataModule:
    data = TextDataModule(
        dataset="json", data_files=write_corpus(tmp_path), cache_dir=str(tmp_path / "cache"), vocab_size=300,
        block_size=4, batch_size=2,
    )  # fmt: skip
    data.use_tokenizer(tokenizer)
    data.setup("fit")
    return data


def test_documents_get_one_bos_each_and_eos_between(tmp_path):
    tokenizer = llama_tokenizer()
    data = prepared(tmp_path, tokenizer)
    assert data.tokenizer.sha256 == tokenizer.sha256
    train, val = np.asarray(data.train_tokens).tolist(), np.asarray(data.val_tokens).tolist()
    assert train.count(BOS) == len(DOCS) and train[0] == BOS
    # Segments of a long document tokenize on their own; with a byte-fallback tokenizer their ids may differ
    # from the whole document's at a cut, so the separators are checked in place and the rest by count.
    assert [i for i, t in enumerate(train) if t == EOS] == [
        i - 1 for i, t in enumerate(train) if t == BOS and i > 0
    ]
    assert val == expected(tokenizer, VAL)
    assert not list((tmp_path / "cache").rglob("tokenizer-bpe*"))  # no BPE was trained


def test_without_the_bos_rule_no_bos_is_added(tmp_path):
    tokenizer = llama_tokenizer(add_bos=False)
    data = prepared(tmp_path, tokenizer)
    assert np.asarray(data.val_tokens).tolist() == expected(tokenizer, VAL)
    assert BOS not in np.asarray(data.train_tokens).tolist()


def test_the_cache_is_keyed_by_the_tokenizer_and_its_rules(tmp_path):
    with_bos, without = llama_tokenizer(), llama_tokenizer(add_bos=False)
    assert with_bos.sha256 != without.sha256  # same tokenizers JSON, other rules
    prepared(tmp_path, with_bos)
    prepared(tmp_path, without)
    folders = sorted(p.name for p in (tmp_path / "cache").glob("*/tokens-*"))
    assert folders == sorted(f"tokens-{t.sha256[:16]}" for t in (with_bos, without))


def test_streaming_uses_the_same_separators(tmp_path):
    tokenizer = llama_tokenizer()
    data = TextDataModule(
        dataset="json", data_files=write_corpus(tmp_path), cache_dir=str(tmp_path / "cache"), vocab_size=300,
        block_size=4, batch_size=2, streaming=True, val_docs=2,
    )  # fmt: skip
    data.use_tokenizer(tokenizer)
    data.setup("fit")
    # Streaming puts the separator before every document, the first one too.
    assert np.asarray(data.val_tokens).tolist() == [EOS, *expected(tokenizer, VAL)]


def test_prepare_builds_the_cache_a_fine_tune_fit_reads(
    corpus, tmp_path, monkeypatch, capsys, script
) -> None:
    """`data.prepare --config <fine-tune config>` tokenizes with the init_from model's tokenizer, and fit then
    finds that cache: it tokenizes nothing and adds no token folder."""
    transformers = pytest.importorskip("transformers")
    from data.prepare import main
    from interop import read_tokenizer

    llama = tmp_path / "llama"
    save_llama(transformers, llama, shard=False)
    cache, config = tmp_path / "cache", str(Path(__file__).parents[2] / "configs" / "finetune-smollm2.yaml")
    argv = ["--config", config, "--model.init_from", str(llama), "--data.data_files", str(corpus)]
    argv += ["--data.cache_dir", str(cache), "--data.block_size", "32"]
    monkeypatch.setattr("sys.argv", ["data.prepare", *argv])
    assert main() == 0
    folder = Path(capsys.readouterr().out.split("ready in ")[1].split(";")[0])
    assert Tokenizer.from_file(folder / "tokenizer.json").sha256 == read_tokenizer(llama).sha256
    built = sorted(cache.rglob("*"))
    fit = script("train.py", "fit", *argv, "--data.batch_size", "2", "--trainer.max_steps", "1",
                 "--trainer.limit_val_batches", "0", "--samples.every_n_steps", "0", "--trainer.logger", "false",
                 "--attention_maps.every_n_steps", "0", "--trainer.default_root_dir", str(tmp_path / "runs"))  # fmt: skip
    assert "tokenizing" not in fit.stderr, "fit found the prepared cache"
    assert sorted(cache.rglob("*")) == built
