"""With a real Trainer: resuming from a mid-run checkpoint continues with exactly the uninterrupted batches."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data.datamodule import TextDataModule


class BatchRecorder(L.LightningModule):
    """Trains nothing; remembers every input batch it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, _ = batch
        self.seen.append(x.clone())
        return self.weight * x.float().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(jsonl_corpus: Path, cache_dir: Path, run_dir: Path, ckpt_path: str | None = None) -> BatchRecorder:
    data = TextDataModule(
        dataset="json",
        data_files=str(jsonl_corpus),
        vocab_size=300,
        block_size=8,
        batch_size=2,
        cache_dir=str(cache_dir),
    )
    model = BatchRecorder()
    trainer = L.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=run_dir,
        callbacks=[ModelCheckpoint(dirpath=run_dir, every_n_train_steps=2, save_top_k=-1)],
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model


@pytest.mark.filterwarnings(
    "ignore::UserWarning"
)  # Lightning's notes about non-resumable loaders and workers
def test_resumed_run_sees_the_uninterrupted_batches(
    jsonl_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    uninterrupted = _fit(jsonl_corpus, cache_dir, tmp_path / "first")
    assert len(uninterrupted.seen) == 8, "4 optimizer steps x 2 accumulated batches"
    checkpoint = next((tmp_path / "first").glob("*step=2.ckpt"))
    resumed = _fit(jsonl_corpus, cache_dir, tmp_path / "resumed", ckpt_path=str(checkpoint))
    assert len(resumed.seen) == 4
    for expected, actual in zip(uninterrupted.seen[4:], resumed.seen, strict=True):
        assert torch.equal(expected, actual)
    assert not torch.equal(uninterrupted.seen[0], resumed.seen[0])
