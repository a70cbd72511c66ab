"""A training run that checkpoints every step, for the tests that kill it (tests/training/test_checkpoint_faults.py):
a small GPT on tiny Shakespeare or the tests' corpus, the same initial weights in every segment, optionally
saving asynchronously; its final weights go to <run_dir>/final.pt.

    python -m tests.training.chaos_worker --run_dir DIR --cache DIR --steps 10 [--resume] [--async] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QUIET = dict(devices=1, max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
             limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1.0)  # fmt: skip


def main(args: argparse.Namespace) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from checkpoints.run_lock import own_run_dir
    from checkpoints.settings import checkpoint_io, resume_last
    from data.datamodule import TINY_SHAKESPEARE, TextDataModule
    from training import LastCheckpoint, LitGPT

    run_dir = Path(args.run_dir)
    checkpoints = run_dir / "checkpoints"
    own_run_dir(run_dir)  # held until this process ends
    ckpt_path = resume_last(checkpoints)[0] if args.resume else None
    print(f"resuming from: {ckpt_path}", file=sys.stderr, flush=True)
    trainer = L.Trainer(
        default_root_dir=run_dir, max_steps=args.steps, accelerator="cpu", plugins=[checkpoint_io(2, args.async_save)],
        callbacks=[ModelCheckpoint(dirpath=checkpoints, save_last=True, every_n_train_steps=1, save_top_k=0,
                                   enable_version_counter=False), LastCheckpoint()], **QUIET,
    )  # fmt: skip
    sizes = {"vocab_size": 384, "block_size": 32}
    corpus = args.corpus or str(TINY_SHAKESPEARE)
    data = TextDataModule(
        data_files=corpus, cache_dir=args.cache, batch_size=8, num_workers=args.workers, **sizes
    )
    torch.manual_seed(0)  # the same initial weights in every segment
    shape = {"n_layer": args.n_layer, "n_head": 4, "n_kv_head": 2, "n_embd": args.n_embd}
    module = LitGPT(**sizes, **shape, warmup_steps=2, learning_rate=3e-3)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    torch.save(module.state_dict(), run_dir / "final.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("--run_dir", "--cache", "--corpus"):
        parser.add_argument(flag)
    for flag, default in (("--steps", 10), ("--n_embd", 32), ("--n_layer", 2), ("--workers", 0)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--async", dest="async_save", action="store_true")
    main(parser.parse_args())
