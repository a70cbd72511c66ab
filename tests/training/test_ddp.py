"""Two CPU processes with DDP (gloo): own batches per rank, identical weights, media only from rank 0."""

from __future__ import annotations

import json

import torch


def test_two_process_ddp_keeps_ranks_in_sync(script, tiny_args, tmp_path):
    dump = {"class_path": "tests.training.rank_dump.RankDump", "init_args": {"out_dir": str(tmp_path)}}
    script(*tiny_args(
        tmp_path / "runs", "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
        "--trainer.max_steps", "4", "--trainer.logger", "false", "--trainer.limit_val_batches", "2",
        "--trainer.val_check_interval", "2", "--samples.every_n_steps", "2", "--attention_maps.every_n_steps", "0",
        f"--trainer.callbacks+={json.dumps(dump)}",
    ), timeout=400)  # fmt: skip
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    # Equal weights hold whatever each rank reads; different inputs at every step show the data is split.
    assert len(rank0["inputs"]) == len(rank1["inputs"]) == 4
    for step, (x0, x1) in enumerate(zip(rank0["inputs"], rank1["inputs"], strict=True)):
        assert x0.shape == x1.shape and not torch.equal(x0, x1), step
    for name, tensor in rank0["state"].items():
        assert torch.equal(tensor, rank1["state"][name]), name
    assert rank0["sample_rows"] > 0 and rank1["sample_rows"] == 0
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4
