"""A full disk is one `error:` line naming the file, exit 2, whoever was writing: a checkpoint (torch.save
wraps the ENOSPC in a RuntimeError), wandb's media, any command's own write."""

from __future__ import annotations

import builtins
import errno
import os

import pytest
import torch

import common.files
from checkpoints.atomic_io import AtomicCheckpointIO, CheckpointSaveError
from common.errors import EXIT_USER_ERROR, run_command

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FillingFile:
    """A binary file whose writes fail with ENOSPC once `room` bytes are written, as on a full disk."""

    def __init__(self, file, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise ENOSPC
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def test_a_checkpoint_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    monkeypatch.setattr(
        common.files, "open", lambda *a, **k: FillingFile(builtins.open(*a, **k), 4096), raising=False
    )
    checkpoint = {"global_step": 1, "state_dict": {"w": torch.zeros(100_000)}}
    with pytest.raises(CheckpointSaveError) as caught:  # the real torch.save, which raises RuntimeError
        io.save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    message = str(caught.value)
    assert "step-00000001.ckpt: No space left on device; free disk space" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_any_command_on_a_full_disk_exits_2_naming_the_file_written(capsys):
    def copy_media():  # wandb moves a logged image into the run folder with shutil.move
        raise OSError(
            errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/media/x.png", None, "runs/tiny/media/x.png"
        )

    assert run_command(copy_media) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert (
        err == "error: cannot write runs/tiny/media/x.png: No space left on device; free disk space there\n"
    )


def test_other_os_errors_stay_bugs():
    def missing():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "internal.json")

    with pytest.raises(FileNotFoundError):
        run_command(missing)


def test_wandb_media_on_a_full_disk_ends_the_fit_in_one_line(script, tiny_args, tmp_path):
    code = (  # only wandb's own move fails: the data and checkpoint writes go on as usual
        "import errno, os, shutil, sys, types, train\n"
        "import wandb.sdk.data_types.base_types.media as media\n"
        "def full(src, dst, *a, **k):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)\n"
        "media.shutil = types.SimpleNamespace(**{**vars(shutil), 'move': full})\n"
        "sys.argv = sys.argv[1:]\n"
        "sys.exit(train.main())\n"
    )
    args = tiny_args(tmp_path, "--trainer.max_steps", "3", "--attention_maps.every_n_steps", "1",
                     "--samples.every_n_steps", "0", "--trainer.val_check_interval", "3")  # fmt: skip
    result = script("-c", code, *args, check=False)
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write ") and "media" in last and "No space left on device" in last
    assert "Traceback" not in result.stderr
