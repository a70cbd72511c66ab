"""One answer to "which checkpoint does this run directory mean", for reading (generate, exports) and resuming."""

from __future__ import annotations

import hashlib
import os
import shutil

import torch

from checkpoints.format import META_KEY, STATE_PREFIX, checkpoint_metadata, load_checkpoint
from checkpoints.resume import choose_resume_checkpoint
from checkpoints.run_dir import RunDir, step_file_name
from model import GPT, ModelConfig

TOKENIZER_JSON = '{"model": "stand-in"}'  # the reader only checks it against its sha256


def save_step(run: RunDir, step: int, seed: int) -> GPT:
    """A resumable checkpoint of a tiny model (weights from `seed`) as `step-<step>.ckpt` in the run."""
    torch.manual_seed(seed)
    model = GPT(ModelConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    sha256 = hashlib.sha256(TOKENIZER_JSON.encode("utf-8")).hexdigest()
    state = {STATE_PREFIX + name: tensor for name, tensor in model.state_dict().items()}
    checkpoint = {
        "state_dict": state,
        META_KEY: checkpoint_metadata(model.config, TOKENIZER_JSON, sha256, {}),
        "global_step": step,
        "optimizer_states": [],
        "loops": {},
    }
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, run.checkpoints / step_file_name(step))
    return model


def same_weights(a: GPT, b: GPT) -> bool:
    return all(torch.equal(t, b.state_dict()[n]) for n, t in a.state_dict().items())


def test_a_run_directory_means_its_newest_step_even_when_last_ckpt_lags(tmp_path):
    run = RunDir(tmp_path / "run")
    older = save_step(run, 2, seed=1)
    shutil.copy(run.checkpoints / step_file_name(2), run.last)  # a kill before last.ckpt was re-linked
    newer = save_step(run, 4, seed=2)
    assert not same_weights(older, newer)
    loaded = load_checkpoint(run.path)
    assert loaded.path == run.checkpoints / step_file_name(4) and same_weights(loaded.model, newer)
    assert choose_resume_checkpoint(run.checkpoints, warn=print) == loaded.path


def test_a_damaged_newest_checkpoint_falls_back_with_one_warning_for_both(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    older = save_step(run, 2, seed=1)
    save_step(run, 4, seed=2)
    newest = run.checkpoints / step_file_name(4)
    os.link(newest, run.last)  # as the atomic save leaves it: last.ckpt is the newest step file
    newest.write_bytes(newest.read_bytes()[:500])  # truncated in place: last.ckpt with it
    loaded = load_checkpoint(run.path)
    assert loaded.path == run.checkpoints / step_file_name(2) and same_weights(loaded.model, older)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and str(newest) in warnings[0] and step_file_name(2) in warnings[0]
    resume_warnings: list[str] = []
    chosen = choose_resume_checkpoint(run.checkpoints, warn=resume_warnings.append)
    assert chosen == loaded.path and len(resume_warnings) == 1 and str(newest) in resume_warnings[0]
