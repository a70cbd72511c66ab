"""Mistakes that printed a traceback (exit 1) now print one `error:` line naming the file or key (exit 2)."""

from __future__ import annotations

import pytest

from common.errors import EXIT_USER_ERROR


def assert_one_line(result, *words: str) -> None:
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]


def test_fit_from_a_text_file(script, tiny_args, tmp_path):
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    result = script(*tiny_args(tmp_path / "runs", "--ckpt_path", str(text)), check=False)
    assert_one_line(result, str(text), "not a checkpoint")
    assert not (tmp_path / "runs").exists()


def test_fit_from_a_truncated_checkpoint(tiny_run, script, tiny_args, tmp_path):
    whole = (tiny_run / "checkpoints" / "last.ckpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(whole[: len(whole) // 2])
    result = script(*tiny_args(tmp_path / "runs", "--ckpt_path", str(truncated)), check=False)
    assert_one_line(result, str(truncated), "truncated or corrupt")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("key", "value"), [("learning_rate", "-1"), ("beta2", "1.5"), ("weight_decay", "-0.1")]
)
def test_invalid_optimizer_values(key, value, script, tiny_args, tmp_path):
    result = script(*tiny_args(tmp_path / "runs", f"--model.{key}", value), check=False)
    assert_one_line(result, f"model.{key}", value)
    assert not (tmp_path / "runs").exists()


def test_validate_with_a_checkpoint_of_another_size(tiny_run, script, tmp_path):
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    config = (tiny_run / "config.yaml").read_bytes()
    result = script(
        "train.py", "validate", "--config", "configs/shakespeare.yaml", "--ckpt_path", str(ckpt),
        "--trainer.default_root_dir", str(tmp_path / "runs"), check=False,
    )  # fmt: skip
    # The tiny run's vocabulary is 384 tokens, the shakespeare config's 1024; the fix names the run's config.
    assert_one_line(result, "vocab_size=1024", "checkpoint: 384", str(tiny_run / "config.yaml"))
    assert (tiny_run / "config.yaml").read_bytes() == config
    assert not (tmp_path / "runs").exists()


def test_a_config_that_is_not_yaml_is_named(script, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  n_layer: [1\n")
    result = script("train.py", "fit", "--config", str(config), check=False)
    assert_one_line(result, f"--config {config}: not valid YAML", f"in {config}, line 2")
    assert "<unicode string>" not in result.stderr


def test_a_failed_first_run_leaves_no_folder_it_made(script, tiny_args, tmp_path):
    data = tmp_path / "latin1.txt"
    data.write_bytes("caf\xe9 ".encode("latin-1") * 100)  # not UTF-8: the data stage fails inside fit
    root = tmp_path / "new" / "runs"
    result = script(*tiny_args(root, "--data.data_files", str(data)), check=False)
    assert_one_line(result, str(data))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt"]
