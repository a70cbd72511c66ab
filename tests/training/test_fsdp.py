"""FSDP2 (ModelParallelStrategy + fully_shard) in 2 CPU processes (gloo) on a streamed corpus: sharded
weights, a sharded checkpoint, an exact resume, and each rank reading its own part of the stream."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from checkpoints.format import CheckpointError, load_checkpoint
from checkpoints.resume import (
    check_resumable,
    choose_resume_checkpoint,
    expand_run_dir_resume,
    read_resume_point,
)
from checkpoints.run_dir import checkpoint_step
from tests.conftest import run_generate
from training.wandb_logger import WANDB_ID_KEY

FSDP2 = {
    "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
    "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1},
}
BATCH, BLOCK, SEED = 4, 32, 1337


def _fsdp_args(tiny_args, root: Path, corpus: Path, cache: Path, dump: Path, *extra: str) -> list[str]:
    callback = {"class_path": "tests.training.fsdp_dump.StepDump", "init_args": {"out_dir": str(dump)}}
    return tiny_args(
        root,
        "--trainer.strategy",
        json.dumps(FSDP2),
        "--trainer.devices",
        "2",
        "--trainer.max_steps",
        "4",
        "--trainer.logger",
        "false",
        "--trainer.log_every_n_steps",
        "2",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.val_check_interval",
        "2",
        "--checkpoint.every_n_train_steps",
        "2",
        "--checkpoint.save_top_k",
        "-1",
        "--samples.every_n_steps",
        "2",
        "--samples.max_new_tokens",
        "4",
        "--attention_maps.every_n_steps",
        "2",
        "--data.dataset",
        "json",
        "--data.data_files",
        str(corpus),
        "--data.streaming",
        "true",
        "--data.tokenizer_train_docs",
        "40",
        "--data.val_docs",
        "30",
        "--data.cache_dir",
        str(cache),
        "--data.block_size",
        str(BLOCK),
        "--data.batch_size",
        str(BATCH),
        f"--trainer.callbacks+={json.dumps(callback)}",
        *extra,
    )


def _ranks(folder: Path) -> list[dict]:
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.fixture(scope="module")
def fsdp_runs(script, tiny_args, corpus, tmp_path_factory):
    """A straight 4-step FSDP2 run, and a second one resumed from its step-2 sharded checkpoint."""
    tmp = tmp_path_factory.mktemp("fsdp")
    paragraphs = corpus.read_text(encoding="utf-8").split("\n\n")[:300]
    stream = tmp / "stream.jsonl"  # one JSON document per paragraph, read with streaming=True
    stream.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs), encoding="utf-8")
    cache = tmp / "cache"
    (tmp / "straight").mkdir()
    (tmp / "resumed").mkdir()
    script(*_fsdp_args(tiny_args, tmp / "runs", stream, cache, tmp / "straight"), timeout=600)
    step2 = tmp / "runs" / "tiny" / "checkpoints" / "epoch=0-step=2.ckpt"
    script(
        *_fsdp_args(
            tiny_args,
            tmp / "runs",
            stream,
            cache,
            tmp / "resumed",
            "--run_name",
            "resumed",
            "--ckpt_path",
            str(step2),
        ),
        timeout=600,
    )
    return {
        "straight": _ranks(tmp / "straight"),
        "resumed": _ranks(tmp / "resumed"),
        "step2": step2,
        "run_dir": tmp / "runs" / "tiny",
        "cache": cache,
    }


def test_checkpoint_is_sharded_one_file_per_rank(fsdp_runs):
    files = sorted(p.name for p in fsdp_runs["step2"].iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    meta = torch.load(fsdp_runs["step2"] / "meta.pt", weights_only=True)
    assert meta["global_step"] == 2 and meta["gqa_gpt"]["model_config"]["n_layer"] == 2


def test_resumed_run_repeats_the_straight_run_exactly(fsdp_runs):
    for straight, resumed in zip(fsdp_runs["straight"], fsdp_runs["resumed"], strict=True):
        assert straight["strategy"] == "ModelParallelStrategy" and straight["world_size"] == 2
        assert sorted(straight["losses"]) == [1, 2, 3, 4] and sorted(resumed["losses"]) == [3, 4]
        assert all(straight["losses"][s] == resumed["losses"][s] for s in (3, 4))  # tolerance 0
        for name, tensor in straight["state"].items():
            assert torch.equal(tensor, resumed["state"][name]), name
    rank0, rank1 = fsdp_runs["straight"]
    for name, tensor in rank0["state"].items():  # the shards gathered on each rank are one model
        assert torch.equal(tensor, rank1["state"][name]), name


def test_each_rank_holds_only_its_shard_of_the_weights(fsdp_runs):
    for record in fsdp_runs["straight"]:
        assert record["sharded"], "every parameter is a DTensor shard"
        # Each tensor is split along dim 0 into 2 (the first shard takes the odd row): about half per rank.
        assert record["local_numel"] <= record["full_numel"] // 2 + 1024


def test_ranks_read_their_own_part_of_the_stream(fsdp_runs):
    # Streaming tokenizes on the fly (no train.bin): each rank reads its own documents, so no window repeats.
    windows = [
        {tuple(row.tolist()) for batch in record["batches"].values() for row in batch}
        for record in fsdp_runs["straight"]
    ]
    assert len(windows[0]) == len(windows[1]) == 4 * BATCH, "no window twice on one rank"
    assert not windows[0] & windows[1], "no window on both ranks"


def test_generate_reads_a_sharded_checkpoint_in_one_process(fsdp_runs, capsys):
    run_dir = fsdp_runs["run_dir"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = load_checkpoint(run_dir)  # the run directory: its newest whole sharded folder
    assert not [w for w in caught if "torch.distributed" in str(w.message)]  # one process is what we mean
    # one answer for generate and resume: the newest whole checkpoint, the step-4 folder (last.ckpt holds the same)
    assert final.path == run_dir / "checkpoints" / "epoch=0-step=4.ckpt"
    weights = final.model.state_dict()
    gathered = fsdp_runs["straight"][0]["state"]  # the full weights gathered from the shards at the end
    assert sorted(weights) == sorted(gathered)
    for name, tensor in gathered.items():
        assert torch.equal(weights[name], tensor), name
    at_step2 = load_checkpoint(fsdp_runs["step2"]).model.state_dict()
    assert not torch.equal(at_step2["blocks.0.attn.qkv.weight"], weights["blocks.0.attn.qkv.weight"])
    args = ("--max_new_tokens", "8", "--temperature", "0", "--prompt", "The")
    code, out, err = run_generate(capsys, "--checkpoint", str(run_dir), *args)
    # a 4-step model's 8 greedy tokens may be newlines: what counts is that text came after the prompt's line
    assert code == 0 and out.startswith("The") and len(out) > len("The\n"), err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("__1_0.distcp", "shard file __1_0.distcp is missing"),
        (".metadata", "sharded checkpoint without .metadata"),
        ("meta.pt", "sharded checkpoint folder without meta.pt"),
    ],
)
def test_an_interrupted_sharded_save_is_one_line(fsdp_runs, tmp_path, capsys, damage, message):
    broken = tmp_path / "checkpoints" / "last.ckpt"  # read through its run directory, as a user would
    shutil.copytree(fsdp_runs["step2"], broken)
    (broken / damage).unlink()
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(tmp_path)
    assert str(broken) in str(err.value) and "use an earlier checkpoint" in str(err.value)
    code, _, stderr = run_generate(capsys, "--checkpoint", str(tmp_path), "--prompt", "The")
    assert code == 2 and stderr.count("\n") == 1 and message in stderr


def test_a_sharded_run_resumes_from_its_newest_whole_folder(fsdp_runs, tmp_path):
    run_dir = fsdp_runs["run_dir"]
    checkpoints = run_dir / "checkpoints"
    args, expanded = expand_run_dir_resume(["fit", "--ckpt_path", str(run_dir)])
    assert (
        expanded
    )  # step 4 is in last.ckpt and in the step folder; the one Lightning rewrites in place loses
    assert args[args.index("--ckpt_path") + 1] == str(checkpoints / "epoch=0-step=4.ckpt")
    assert checkpoint_step(checkpoints / "last.ckpt") == 4 and checkpoint_step(fsdp_runs["step2"]) == 2
    # A kill during the step-4 saves: the step folder lacks a shard, last.ckpt its meta.pt. Step 2 resumes.
    copy = tmp_path / "checkpoints"
    shutil.copytree(checkpoints, copy)
    (copy / "epoch=0-step=4.ckpt" / "__1_0.distcp").unlink()
    (copy / "last.ckpt" / "meta.pt").unlink()
    warnings_seen: list[str] = []
    assert choose_resume_checkpoint(copy, warn=warnings_seen.append) == copy / "epoch=0-step=2.ckpt"
    assert len(warnings_seen) == 1 and "__1_0.distcp is missing" in warnings_seen[0]
    # A folder of weights only (no optimizer state in its index) cannot resume training.
    weights_only = tmp_path / "weights-only.ckpt"
    model = load_checkpoint(fsdp_runs["step2"]).model
    state = {"state_dict": {"model." + name: tensor for name, tensor in model.state_dict().items()}}
    dcp.save(state, checkpoint_id=weights_only, no_dist=True)
    shutil.copy(fsdp_runs["step2"] / "meta.pt", weights_only / "meta.pt")
    load_checkpoint(weights_only)  # readable for generate.py ...
    with pytest.raises(CheckpointError, match="lacks optimizer_0"):
        check_resumable(weights_only)  # ... but not resumable


def test_a_sharded_checkpoint_gives_back_its_wandb_run_id(fsdp_runs, tmp_path):
    folder = tmp_path / "epoch=0-step=2.ckpt"
    shutil.copytree(fsdp_runs["step2"], folder)
    meta = torch.load(folder / "meta.pt", weights_only=True)
    torch.save({**meta, WANDB_ID_KEY: "abc123"}, folder / "meta.pt")  # as WandbResume stores it
    assert (
        read_resume_point(str(folder))[WANDB_ID_KEY] == "abc123"
    )  # a resumed run logs to the same wandb run
