"""Loading a checkpoint (generate.py, interop, the exports) verifies its zip checksums, as resuming does: two
flipped bytes in a tensor's data load silently through torch.load alone."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import torch

from checkpoints.format import load_checkpoint
from checkpoints.run_dir import RunDir, step_file_name
from tests.checkpoints.test_folder_choice import same_weights, save_step
from tests.conftest import run_generate


def flip_two_data_bytes(path: Path) -> str:
    """Flip two bytes in the middle of the largest tensor's stored data; returns that zip member's name."""
    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    # The data follows the 30-byte local header, the name and the extra field (its lengths at offsets 26, 28).
    name_length, extra_length = struct.unpack(
        "<HH", data[member.header_offset + 26 : member.header_offset + 30]
    )
    middle = member.header_offset + 30 + name_length + extra_length + member.file_size // 2
    data[middle] ^= 0x01
    data[middle + 1] ^= 0x01
    path.write_bytes(data)
    return member.filename


def test_flipped_data_bytes_are_one_line_naming_the_file_and_exit_2(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    save_step(run, 2, seed=1)
    path = run.checkpoints / step_file_name(2)
    member = flip_two_data_bytes(path)
    assert torch.load(path, weights_only=True)  # what the check guards against: the damage loads silently
    code, out, err = run_generate(capsys, "--checkpoint", str(path), "--prompt", "a")
    assert code == 2 and out == ""
    assert (
        err
        == f"error: {path}: checksum mismatch in {member}; the file is corrupt: use an earlier checkpoint\n"
    )


def test_a_run_directory_with_a_damaged_newest_checkpoint_loads_the_previous(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    older = save_step(run, 2, seed=1)
    save_step(run, 4, seed=2)
    flip_two_data_bytes(run.checkpoints / step_file_name(4))
    loaded = load_checkpoint(run.path)
    assert loaded.path == run.checkpoints / step_file_name(2) and same_weights(loaded.model, older)
    [warning] = capsys.readouterr().err.splitlines()
    assert "checksum mismatch" in warning and step_file_name(4) in warning
