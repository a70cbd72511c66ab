"""streaming=True: the tokenizer and validation set built once, training text tokenized on the fly per reader."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data import EOS_TOKEN, Tokenizer
from data.datamodule import TextDataModule
from data.stream import StreamBatches

VOCAB = 300


def _write_shards(folder: Path, documents: list[str], shards: int) -> list[str]:
    """JSON-lines shards, document i in shard i % shards; each document starts with its id."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"shard-{index}.jsonl" for index in range(shards)]
    for index, file in enumerate(files):
        rows = [
            json.dumps({"text": f"doc{i}: {doc}"}) + "\n"
            for i, doc in enumerate(documents)
            if i % shards == index
        ]
        file.write_text("".join(rows), encoding="utf-8")
    return [str(file) for file in files]


def _module(files: list[str], cache_dir: Path, **overrides) -> TextDataModule:
    settings = {
        "dataset": "json",
        "data_files": files,
        "streaming": True,
        "vocab_size": VOCAB,
        "block_size": 16,
        "batch_size": 2,
        "cache_dir": str(cache_dir),
        "tokenizer_train_docs": 30,
        "val_docs": 10,
        **overrides,
    }
    module = TextDataModule(**settings)
    module.setup()
    return module


def _doc_ids(tokenizer: Tokenizer, tokens: np.ndarray) -> list[str]:
    return [
        doc.split(":")[0]
        for doc in tokenizer.decode(tokens.tolist()).split(EOS_TOKEN)
        if doc.startswith("doc")
    ]


def test_validation_is_held_out_and_the_tokenizer_trains_on_the_next_documents(
    documents: list[str], tmp_path: Path, cache_dir: Path
) -> None:
    files = _write_shards(tmp_path / "corpus", documents, shards=1)
    module = _module(files, cache_dir)
    texts = [f"doc{i}: {doc}" for i, doc in enumerate(documents)]
    assert module.tokenizer.sha256 == Tokenizer.train(texts[10:40], VOCAB, show_progress=False).sha256
    assert module.tokenizer.decode(module.val_tokens.tolist()) == "".join(
        EOS_TOKEN + text for text in texts[:10]
    )
    assert len(module.heldout) == 10
    assert module.meta["val"]["tokens"] == len(module.val_tokens)
    assert [path.name for path in cache_dir.rglob("*.bin")] == ["val.bin"], "no training tokens are written"


@pytest.mark.parametrize("shards", [4, 3])  # shards split by node (4 readers), documents strided (3 files)
def test_readers_read_disjoint_documents_and_skip_validation(
    new_documents, tmp_path: Path, cache_dir: Path, shards: int
) -> None:
    documents = new_documents(80, seed=3, words_per_doc=30)
    module = _module(_write_shards(tmp_path / "corpus", documents, shards), cache_dir, val_docs=8)
    seen: list[set[str]] = []
    for rank in range(2):  # 2 ranks x 2 workers = 4 readers
        batches = StreamBatches(
            module.source.load()[0], "text", module.tokenizer, module.heldout, 16, 2, rank=rank, world_size=2
        )
        for reader in (2 * rank, 2 * rank + 1):
            stream = batches.reader_batches(reader, 4)
            tokens = [next(stream)[0] for _ in range(12)]
            seen.append(set(_doc_ids(module.tokenizer, torch.cat([t.flatten() for t in tokens]).numpy())))
    for i in range(4):
        for j in range(i + 1, 4):
            assert not seen[i] & seen[j], (i, j)
    held_out = set(_doc_ids(module.tokenizer, np.asarray(module.val_tokens)))
    assert len(held_out) == 8 and not held_out & set().union(*seen)
    assert all(len(ids) > 2 for ids in seen)


class BatchRecorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch[0].clone())
        return self.weight * batch[0].float().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(
    files: list[str],
    cache_dir: Path,
    run_dir: Path,
    workers: int,
    accumulate: int,
    ckpt_path: str | None = None,
):
    data = TextDataModule(
        dataset="json",
        data_files=files,
        streaming=True,
        vocab_size=VOCAB,
        block_size=8,
        batch_size=2,
        num_workers=workers,
        cache_dir=str(cache_dir),
        tokenizer_train_docs=30,
        val_docs=5,
    )
    model = BatchRecorder()
    trainer = L.Trainer(
        max_steps=6,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=run_dir,
        callbacks=[ModelCheckpoint(dirpath=run_dir, every_n_train_steps=3, save_top_k=-1)],
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's notes about workers and iterable loaders
@pytest.mark.parametrize(("workers", "accumulate"), [(0, 2), (2, 2), (2, 1)])
def test_resume_continues_the_stream_exactly(
    new_documents, tmp_path: Path, cache_dir: Path, workers: int, accumulate: int
) -> None:
    """The checkpoint holds the position after the last trained batch, not after the prefetched ones; resumed
    at batch 3 of 2 workers (accumulate 1), the second worker's reader must give the first batch."""
    files = _write_shards(tmp_path / "corpus", new_documents(60, seed=4, words_per_doc=40), shards=2)
    straight = _fit(files, cache_dir, tmp_path / "straight", workers, accumulate)
    assert len(straight.seen) == 6 * accumulate
    checkpoint = next((tmp_path / "straight").glob("*step=3.ckpt"))
    assert torch.load(checkpoint, weights_only=True)["TextDataModule"]["stream"]["num_workers"] == workers
    resumed = _fit(files, cache_dir, tmp_path / "resumed", workers, accumulate, ckpt_path=str(checkpoint))
    assert len(resumed.seen) == 3 * accumulate
    for expected, actual in zip(straight.seen[3 * accumulate :], resumed.seen, strict=True):
        assert torch.equal(expected, actual)
    assert not torch.equal(straight.seen[0], resumed.seen[0])
