"""The export is all-or-nothing, never overwrites by accident, and the CLI fails in one line."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import interop.export_hf as export_module
from checkpoints.format import META_KEY, STATE_PREFIX, checkpoint_metadata
from common.errors import EXIT_USER_ERROR
from common.files import OutputPathError
from data.tokenizer import Tokenizer
from interop import load_hf
from interop.export_hf import export_hf, main
from model import GPT

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_checkpoint(model: GPT, tokenizer_json: str, path: Path) -> Path:
    """A checkpoint in the format of checkpoints/format.py, as training writes it."""
    sha256 = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
    meta = checkpoint_metadata(model.config, tokenizer_json, sha256, data={})
    state = {f"{STATE_PREFIX}{name}": tensor for name, tensor in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, META_KEY: meta, "global_step": 7}, path)
    return path


def folder_snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def fail_mid_write(tensors, filename, metadata=None):
    Path(filename).write_bytes(b"\x00" * 100)  # half a file, as a full disk leaves it
    # safetensors' own words for ENOSPC (seen on a full tmpfs), which name no file
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def test_interrupted_export_leaves_nothing(make_model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "save_file", fail_mid_write)
    with pytest.raises(OSError, match="No space"):
        export_hf(make_model(), tokenizer, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling


def test_an_export_onto_a_full_disk_is_one_line_naming_the_file(
    make_model, tokenizer_json, tmp_path, capsys, monkeypatch
):
    write_checkpoint(make_model(), tokenizer_json, tmp_path / "run" / "checkpoints" / "last.ckpt")
    monkeypatch.setattr(export_module, "save_file", fail_mid_write)
    assert main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot write "), err
    assert "model.safetensors: No space left on device; free disk space" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_interrupted_forced_export_keeps_the_old_folder(make_model, tokenizer, tmp_path, monkeypatch):
    old_model = make_model(seed=1)
    out = export_hf(old_model, tokenizer, tmp_path / "hf")
    before = folder_snapshot(out)
    monkeypatch.setattr(export_module, "save_file", fail_mid_write)
    with pytest.raises(OSError):
        export_hf(make_model(seed=2), tokenizer, out, force=True)
    assert folder_snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert torch.equal(load_hf(out).wte.weight, old_model.wte.weight)


def test_existing_folder_needs_force(make_model, tokenizer, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="--force"):
        export_hf(make_model(), tokenizer, out)
    assert folder_snapshot(out) == {"notes.txt": b"mine"}
    new_model = make_model(seed=3)
    export_hf(new_model, tokenizer, out, force=True)
    assert not (out / "notes.txt").exists()
    assert torch.equal(load_hf(out).wte.weight, new_model.wte.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_tokenizer_without_eos_is_refused():
    """The exports take a Tokenizer, which cannot be built without an EOS token to stop at."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import models

    with pytest.raises(ValueError, match=re.escape("<|endoftext|>")):
        Tokenizer(BackendTokenizer(models.BPE()))


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_cli_exports_a_run_directory(make_model, tokenizer_json, tmp_path, capsys, tie):
    model = make_model(tie=tie)
    write_checkpoint(model, tokenizer_json, tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "exported" in capsys.readouterr().out
    loaded = load_hf(tmp_path / "hf")
    assert all(torch.equal(t, loaded.state_dict()[n]) for n, t in model.state_dict().items())


@pytest.mark.parametrize(
    "checkpoint,out,where",
    [
        ("run", "run", "is"),
        ("run/checkpoints/last.ckpt", "run", "holds"),
        ("run", "run/checkpoints", "is inside"),  # a new folder in the run is fine: the GGUF test writes one
    ],
    ids=["the-run", "holding-it", "inside-it"],
)
def test_force_never_replaces_the_model_being_exported(
    make_model, tokenizer_json, tmp_path, capsys, checkpoint, out, where
):
    write_checkpoint(make_model(), tokenizer_json, tmp_path / "run" / "checkpoints" / "last.ckpt")
    (tmp_path / "run" / "config.yaml").write_text("model: {}\n")
    before = folder_snapshot(tmp_path)
    assert main(["--checkpoint", str(tmp_path / checkpoint), "--out", str(tmp_path / out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path / out} {where} ") and err.count("\n") == 1, err
    assert folder_snapshot(tmp_path) == before and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_help_describes_the_export_in_whole_sentences(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "for our own, the class of its architecture (Mistral, Qwen2, Qwen3) for a model that came as one."
        in text
    )


def start_cli(*args: str) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "interop.export_hf", *args]
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_cli_errors_are_one_line(make_model, tokenizer_json, tmp_path):
    checkpoint = write_checkpoint(make_model(), tokenizer_json, tmp_path / "x.ckpt")
    (tmp_path / "taken").mkdir()
    # Both start at once: each pays the interpreter and torch start-up, which dominates.
    missing = start_cli("--checkpoint", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "hf"))
    exists = start_cli("--checkpoint", str(checkpoint), "--out", str(tmp_path / "taken"))
    missing_err, exists_err = missing.communicate()[1], exists.communicate()[1]

    assert missing.returncode == EXIT_USER_ERROR
    assert missing_err.startswith("error: ") and missing_err.count("\n") == 1
    assert "nope.ckpt" in missing_err and not (tmp_path / "hf").exists()
    assert exists.returncode == EXIT_USER_ERROR
    assert exists_err.startswith("error: ") and exists_err.count("\n") == 1
    assert "--force" in exists_err and list((tmp_path / "taken").iterdir()) == []


def test_export_folder_gets_the_usual_permissions(make_model, tokenizer, tmp_path):
    previous = os.umask(0o022)
    try:
        out = export_hf(make_model(), tokenizer, tmp_path / "hf")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # a temp folder's 0700 would hide it from other users
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}
