"""A file that is no checkpoint at all (a run's config.yaml, a tokenizer.json) is named so, with the run
directory to pass; a damaged checkpoint still says it is truncated or corrupt."""

from __future__ import annotations

import pytest
import torch

import generate as cli
from checkpoints.format import read_checkpoint
from checkpoints.run_dir import CheckpointError


@pytest.mark.parametrize("name", ["config.yaml", "tokenizer.json"])
def test_a_runs_text_file_is_not_a_checkpoint_and_the_run_is_named(tmp_path, capsys, name):
    run = tmp_path / "shakespeare"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000010.ckpt").write_bytes(b"")
    (run / name).write_text("model:\n  n_layer: 2\n", encoding="utf-8")
    assert cli.main(["--checkpoint", str(run / name), "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: {run / name}: not a checkpoint (torch.save did not write it); pass the run directory {run}\n"
    )


def test_a_text_file_outside_a_run_says_what_to_pass(tmp_path):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "checkpoints").mkdir()  # as in this repository: the checkpoints/ package, no .ckpt in it
    (tmp_path / "checkpoints" / "format.py").write_text("", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a checkpoint .*; pass a .ckpt file or a run directory$"):
        read_checkpoint(tmp_path / "notes.txt")


@pytest.mark.parametrize("keep", [0, 200])
def test_a_cut_short_save_is_still_truncated(tmp_path, keep):
    whole = tmp_path / "whole.ckpt"
    torch.save({"w": torch.zeros(1000)}, whole)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole.read_bytes()[:keep])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_checkpoint(cut)
