"""A short training run for the checkpoint fault tests, started as a subprocess so that it can be killed.

    python tests/training/ckpt_worker.py CORPUS CACHE RUN_DIR MAX_STEPS [--async] [--resume] [--workers N]

Tiny model, a checkpoint every step through the CheckpointIO train.py installs; `--resume` resolves
`--ckpt_path last` the way train.py does (sweep, then choose_resume_checkpoint). The final weights go to
RUN_DIR/final.pt. Lighter than train.py (no CLI, no wandb), so a chain of killed runs stays quick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data import TextDataModule
from training import LastCheckpoint, LitGPT
from training.checkpointing import checkpoint_io, prepare_checkpoint_dir

MODEL = dict(vocab_size=384, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, warmup_steps=2,
             learning_rate=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("corpus", "cache", "run_dir"):
        parser.add_argument(name)
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--async", dest="async_save", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    run_dir = Path(args.run_dir)
    checkpoints = run_dir / "checkpoints"
    ckpt_path = prepare_checkpoint_dir(checkpoints, "last" if args.resume else None, args.cache)
    print(f"resuming from: {ckpt_path}", file=sys.stderr)
    trainer = L.Trainer(
        default_root_dir=run_dir, max_steps=args.max_steps, max_epochs=-1, accelerator="cpu", devices=1,
        logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0, gradient_clip_val=1.0, plugins=[checkpoint_io(2, args.async_save)],
        callbacks=[ModelCheckpoint(dirpath=checkpoints, save_last=True, every_n_train_steps=1, save_top_k=0,
                                   enable_version_counter=False), LastCheckpoint()],
    )  # fmt: skip
    data = TextDataModule(data_files=args.corpus, cache_dir=args.cache, vocab_size=384, block_size=32,
                          batch_size=8, num_workers=args.workers)
    torch.manual_seed(0)  # the same initial weights in every run
    module = LitGPT(**MODEL)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    torch.save(module.state_dict(), run_dir / "final.pt")


if __name__ == "__main__":
    main()
