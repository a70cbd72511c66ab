"""train.py's seams, each one `error:` line and exit 2 before anything is read or written: a `--ckpt_path last`
with no run named, a run folder that cannot be written, the subcommands LitGPT has no loop for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import train
from training.checks import SECTIONS, section_keys

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


def train_error(monkeypatch, capsys, tmp_path, *args: str) -> str:
    """The one error line of `train.py args` run in a folder of `tmp_path`, which must stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    assert train.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    assert list(cwd.iterdir()) == []  # no runs/default started
    return err


def test_ckpt_path_last_without_a_run_names_the_run_folder_form(monkeypatch, capsys, tmp_path):
    # A missing data file, so that without the check this fails fast instead of training a default run.
    err = train_error(
        monkeypatch, capsys, tmp_path, "fit", "--ckpt_path", "last", "--data.data_files", "absent.txt"
    )
    assert "--ckpt_path runs/<run>" in err


@pytest.mark.parametrize("key", ["--trainer.default_root_dir", "--data.cache_dir"])
@pytest.mark.parametrize("folder", ["/proc/nope", "{tmp}/a-file/runs"])
def test_a_folder_that_cannot_be_written_is_one_line(monkeypatch, capsys, tmp_path, key, folder):
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    folder = folder.format(tmp=tmp_path)
    assert key in train_error(monkeypatch, capsys, tmp_path, "fit", "--config", TINY, key, folder)


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "/abs/run"])
def test_a_run_name_that_is_a_path_is_refused(monkeypatch, capsys, tmp_path, name):
    root = tmp_path / "cwd" / "runs"
    err = train_error(
        monkeypatch, capsys, tmp_path, "fit", "--config", TINY, "--run_name", name,
        "--trainer.default_root_dir", str(root), "--data.data_files", "absent.txt",
    )  # fmt: skip
    assert "--run_name" in err and "trainer.default_root_dir" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cwd"]  # nothing beside the root either


@pytest.mark.parametrize(("accelerator", "said"), [
    ("gpu", "not available on this machine (available: cpu)"),
    ("tpu", "not available on this machine (available: cpu)"),  # was a ModuleNotFoundError: torch_xla
    ("cuda", "use --trainer.accelerator auto (or cpu)"),
    ("gpus", "not an accelerator name"),
])  # fmt: skip
def test_an_accelerator_the_machine_lacks_is_one_line(monkeypatch, capsys, tmp_path, accelerator, said):
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator, XLAAccelerator

    # A CPU-only machine, wherever this runs.
    for lacking in (CUDAAccelerator, MPSAccelerator, XLAAccelerator):
        monkeypatch.setattr(lacking, "is_available", staticmethod(lambda: False))
    err = train_error(
        monkeypatch, capsys, tmp_path, "fit", "--config", TINY, "--trainer.accelerator", accelerator,
        "--data.data_files", "absent.txt",
    )  # fmt: skip
    assert f"--trainer.accelerator {accelerator}:" in err and said in err


@pytest.mark.parametrize(("key", "value"), [("max_steps", "-5"), ("max_epochs", "-2")])
def test_a_negative_step_or_epoch_limit_is_one_line(monkeypatch, capsys, tmp_path, key, value):
    # Lightning refused them with a 38-line MisconfigurationException traceback.
    err = train_error(
        monkeypatch, capsys, tmp_path, "fit", "--config", TINY, f"--trainer.{key}", value,
        "--data.data_files", "absent.txt",
    )  # fmt: skip
    assert f"--trainer.{key} {value}: give a count, or -1 for no limit" in err


@pytest.mark.parametrize("args", [
    ["fit", "--config", "absent.yaml"], ["fitt"], ["fit", "--trainer.max_steps=-5"],
    ["fit", "--config", TINY, "--run_name", "../elsewhere"], ["validate", "--trainer.max_epochs", "-3"],
    ["fit", "--config", TINY, "--model.n_layr", "3"], ["fit", "--data.batch=4"], ["fit", "--trainer.max_stepz=3"],
    ["fit", "--checkpoint.every_n_train_step", "3"],
])  # fmt: skip
def test_a_refusal_of_the_command_line_comes_before_lightnings_import(tmp_path, args):
    # Lightning's import is seconds; these refusals need only the command line and its config files.
    code = (
        "import sys, train; sys.argv = ['train.py', *sys.argv[1:]]; code = train.main(); "
        "print(code, 'lightning' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("error:") and done.stderr.count("\n") == 1, done.stderr


def test_a_misspelt_key_of_ours_names_the_key_it_resembles(monkeypatch, capsys, tmp_path):
    config = tmp_path / "mine.yaml"
    (tmp_path / "again").mkdir()
    config.write_text("model:\n  n_heads: 4\n")
    err = train_error(monkeypatch, capsys, tmp_path, "fit", "--config", TINY, "--config", str(config))
    assert f"--config {config}: model.n_heads is not a key (did you mean model.n_head?" in err
    err = train_error(
        monkeypatch, capsys, tmp_path / "again", "fit", "--config", TINY, "--samples.max_new_token", "3"
    )
    assert "samples.max_new_token is not a key (did you mean samples.max_new_tokens?" in err


@pytest.mark.slow
def test_the_early_key_check_knows_every_key_the_parser_takes():
    """The early check reads the sections' keys from their classes' source (training/checks.py SECTIONS, ours and
    Lightning's): a key the parser takes that the check does not know would be refused though valid."""
    shown = subprocess.run([sys.executable, "train.py", "fit", "--help"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    for section in SECTIONS:
        offered = set(re.findall(rf"--{section}\.(\w+)", shown))
        assert offered and offered <= section_keys(section), (section, offered - section_keys(section))


def test_a_key_cut_short_is_not_taken_for_a_longer_one(monkeypatch, capsys, tmp_path):
    # argparse's abbreviations took --trainer.max_step 10 as --trainer.max_steps 10, silently.
    err = train_error(
        monkeypatch, capsys, tmp_path, "fit", "--config", TINY, "--trainer.max_step", "10",
        "--data.data_files", "absent.txt",
    )  # fmt: skip
    assert "trainer.max_step is not a key (did you mean trainer.max_steps?" in err


@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "cpu", "auto", None])
def test_an_accelerator_the_machine_has_passes(monkeypatch, accelerator):
    from lightning.pytorch.accelerators import CUDAAccelerator

    from training.checks import refuse_missing_accelerator

    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))  # a GPU machine
    refuse_missing_accelerator(accelerator)


@pytest.mark.parametrize("subcommand", ["test", "predict"])
def test_subcommands_without_a_loop_are_not_offered(monkeypatch, capsys, tmp_path, subcommand):
    err = train_error(monkeypatch, capsys, tmp_path, subcommand, "--config", TINY)
    assert "choose from 'fit', 'validate'" in err


def test_score_tokens_is_a_key_that_reaches_the_fit_summary(tmp_path):
    from data.datamodule import TextDataModule
    from training import LitGPT
    from training.cli import GPTCLI
    from training.fit_summary import FitSummary

    args = ["--config", TINY, "--score_tokens", "77", "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false"]  # fmt: skip
    cli = GPTCLI(LitGPT, TextDataModule, run=False, args=args)
    assert [c.max_tokens for c in cli.trainer.callbacks if isinstance(c, FitSummary)] == [77]
