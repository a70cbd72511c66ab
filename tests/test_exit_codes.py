"""Every command reports mistakes the same way (one line, exit 2) and never passes a bug off as one."""

from __future__ import annotations

import importlib
import sys

import pytest

from common.errors import EXIT_BUG, EXIT_USER_ERROR

# Runs a command with a bug planted deep inside the model: a plain ValueError from GPT construction, which
# both train.py (building LitGPT) and generate.py (loading the checkpoint) go through.
WITH_INTERNAL_BUG = (
    "import runpy, sys, model.gpt\n"
    "def bug(self): raise ValueError('planted internal bug')\n"
    "model.gpt.GPT.reset_parameters = bug\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def assert_bug_report(result) -> None:
    assert result.returncode == EXIT_BUG, result.stderr
    assert "Traceback" in result.stderr and "ValueError: planted internal bug" in result.stderr
    assert "error: planted" not in result.stderr


def test_internal_value_error_is_a_bug_in_generate(tiny_run, script):
    ckpt = str(tiny_run / "checkpoints" / "last.ckpt")
    result = script(
        "-c", WITH_INTERNAL_BUG, "generate.py", "--checkpoint", ckpt, "--prompt", "a", check=False
    )
    assert_bug_report(result)


def test_internal_value_error_is_a_bug_in_train(script, tiny_args, tmp_path):
    result = script("-c", WITH_INTERNAL_BUG, *tiny_args(tmp_path, "--trainer.max_steps", "1"), check=False)
    assert_bug_report(result)


def missing_checkpoint_commands(tiny_args, tmp_path) -> dict[str, list[str]]:
    """The three commands, each pointed at a checkpoint that does not exist."""
    missing = str(tmp_path / "nope.ckpt")
    return {
        "train.py": tiny_args(tmp_path / "runs", "--ckpt_path", missing),
        "generate.py": ["generate.py", "--checkpoint", missing, "--prompt", "a"],
        "export": ["-m", "interop.export_hf", "--checkpoint", missing, "--out", str(tmp_path / "hf")],
    }


def test_the_three_commands_give_the_same_code_for_a_missing_checkpoint(start_script, tiny_args, tmp_path):
    commands = missing_checkpoint_commands(tiny_args, tmp_path)
    running = {name: start_script(*argv) for name, argv in commands.items()}  # start-up dominates: overlap it
    for name, process in running.items():
        _, stderr = process.communicate(timeout=300)
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert process.returncode == EXIT_USER_ERROR, (name, stderr)
        # train.py's --ckpt_path is our checkpoint (checkpoints.format); the others take any model name (interop).
        missing = "not found" in errors[0] or "no such file or folder" in errors[0]
        assert len(errors) == 1 and "nope.ckpt" in errors[0] and missing, (name, stderr)
        assert "Traceback" not in stderr, name


def test_traceback_env_is_honoured_by_the_three_commands(start_script, tiny_args, tmp_path, monkeypatch):
    monkeypatch.setenv("GQA_GPT_TRACEBACK", "1")
    commands = missing_checkpoint_commands(tiny_args, tmp_path)
    running = {name: start_script(*argv) for name, argv in commands.items()}
    for name, process in running.items():
        _, stderr = process.communicate(timeout=300)
        error_class = "CheckpointError" in stderr or "PretrainedError" in stderr
        assert process.returncode != 0 and "Traceback" in stderr and error_class, (
            name,
            stderr,
        )


@pytest.mark.parametrize(
    "module,flag",
    [
        ("generate", "--checkpoint"),
        ("interop.export_hf", "--out"),
        ("interop.export_gguf", "--dtype"),
        ("benchmarks.decode", "--repeats"),  # all benchmarks: benchmarks.new_parser
    ],
)
def test_a_flag_mistake_is_one_line_and_help_is_unchanged(module, flag, monkeypatch, capsys):
    """argparse's own mistakes (here a flag without its value) too: no usage block before the error line."""
    main = importlib.import_module(module).main
    monkeypatch.setattr(sys, "argv", [module, flag])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USER_ERROR
    assert err == f"error: argument {flag}: expected one argument (see --help)\n", err
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: ") and "\noptions:\n" in out
