"""Output paths (generate.py --attention_map / --attention_html, the exports): refused in one line before any
work when they would replace something or cannot be written; written through a symlink, never over it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import generate as cli
from common.files import OutputPathError, atomic_write, refuse_existing


def generate_error(capsys, tmp_path: Path, *flags: str) -> str:
    """generate.py's one error line for `flags`, with a checkpoint that does not exist: an output path refused
    first proves it is checked before the model is loaded (let alone generated from)."""
    code = cli.main(["--checkpoint", str(tmp_path / "absent.ckpt"), "--prompt", "a", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1, err
    return err


def test_a_device_or_fifo_is_refused_and_left_as_it_is(capsys, tmp_path):
    assert "--attention_html /dev/full" in generate_error(capsys, tmp_path, "--attention_html", "/dev/full")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    fifo = tmp_path / "map.png"
    os.mkfifo(fifo)
    err = generate_error(capsys, tmp_path, "--attention_map", str(fifo), "--force")
    assert "not a regular file" in err and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_existing_file_needs_force(capsys, tmp_path):
    page = tmp_path / "explorer.html"
    page.write_text("kept", encoding="utf-8")
    err = generate_error(capsys, tmp_path, "--attention_html", str(page))
    assert "already exists; pass --force" in err and page.read_text(encoding="utf-8") == "kept"
    err = generate_error(capsys, tmp_path, "--attention_html", str(page), "--force")
    assert "absent.ckpt" in err  # the path passed; the checkpoint is what fails now


def test_a_map_that_is_not_a_png_is_refused(capsys, tmp_path):
    err = generate_error(capsys, tmp_path, "--attention_map", str(tmp_path / "a.txt"))
    assert "--attention_map" in err and ".png" in err and not (tmp_path / "a.txt").exists()


@pytest.mark.parametrize("where", ["/proc/nope/explorer.html", "{tmp}/notes.txt/explorer.html"])
def test_an_unwritable_folder_is_refused_before_generating(capsys, tmp_path, where):
    (tmp_path / "notes.txt").write_text("a file, not a folder", encoding="utf-8")
    err = generate_error(capsys, tmp_path, "--attention_html", where.format(tmp=tmp_path))
    assert "--attention_html" in err and ("cannot write in /proc" in err or "not a folder" in err)


def test_a_symlink_is_written_through(tmp_path):
    target, link = tmp_path / "real.html", tmp_path / "link.html"
    link.symlink_to(target)
    assert refuse_existing(link, False, file=True, suffixes=(".html",)) == target.resolve()
    atomic_write(link, "page")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "page"
    with pytest.raises(OutputPathError, match="already exists"):  # the target is there now
        refuse_existing(link, False, file=True)
