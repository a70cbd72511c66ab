"""Only the fit that creates a run writes its config.yaml: the documented validate (docs/runs.md) leaves the run resumable, and a
resume with another model size is refused (one line, exit 2) before anything is touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture
def run_dir(tiny_run, tmp_path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(tiny_run.parent, root)  # a copy: other tests read the session run as it is
    return root / tiny_run.name


def wandb_segments(run_dir: Path) -> list[str]:
    return sorted(path.name for path in (run_dir / "wandb").glob("offline-run-*"))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_readme_validate_then_resume(run_dir, script, tiny_args, tiny_run):
    config = (run_dir / "config.yaml").read_bytes()
    segments = wandb_segments(run_dir)
    original = wandb_segments(tiny_run)
    # The documented command (docs/runs.md): the training config and the run's checkpoint (the run folder is named after it).
    validate = tiny_args(run_dir.parent, "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"))
    validate[validate.index("fit")] = "validate"
    result = script(*validate)
    assert "val/loss" in result.stdout
    assert (run_dir / "config.yaml").read_bytes() == config
    assert wandb_segments(run_dir) == segments  # nothing logged under the training run's id

    script("train.py", "fit", "--ckpt_path", str(run_dir), "--trainer.max_steps", "8")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    # the copy logs where it now is, not into the folder its saved config.yaml came from
    assert len(wandb_segments(run_dir)) == len(segments) + 1 and wandb_segments(tiny_run) == original


def test_validate_takes_a_run_folder_as_fit_does(run_dir, script, tiny_args):
    before = sorted((str(path), path.stat().st_mtime_ns) for path in run_dir.rglob("*"))
    validate = tiny_args(run_dir.parent, "--ckpt_path", str(run_dir))
    validate[validate.index("fit")] = "validate"
    result = script(*validate)
    assert "val/loss" in result.stdout and "Traceback" not in result.stderr
    # The run's own config alone is enough, as for a resume.
    assert "val/loss" in script("train.py", "validate", "--ckpt_path", str(run_dir)).stdout
    assert sorted((str(path), path.stat().st_mtime_ns) for path in run_dir.rglob("*")) == before


# A resume is exact: data.block_size changes no weight shape, but the batches, so it is as fixed as the sizes.
@pytest.mark.parametrize(
    ("override", "said"),
    [(["--model.n_layer", "6"], "n_layer=6 (checkpoint: 2)"),
     (["--data.block_size", "32"], "data.block_size=32 (checkpoint: 64)")],
)  # fmt: skip
def test_resume_with_another_model_size_is_refused_before_anything_is_touched(
    run_dir, script, override, said
):
    config = (run_dir / "config.yaml").read_bytes()
    segments = wandb_segments(run_dir)
    checkpoints = {path.name: path.stat().st_mtime_ns for path in (run_dir / "checkpoints").iterdir()}
    result = script("train.py", "fit", "--ckpt_path", str(run_dir), *override, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and said in errors[0], result.stderr
    assert (run_dir / "config.yaml").read_bytes() == config
    assert wandb_segments(run_dir) == segments
    assert {path.name: path.stat().st_mtime_ns for path in (run_dir / "checkpoints").iterdir()} == checkpoints
    script(
        "train.py", "fit", "--ckpt_path", str(run_dir), "--trainer.max_steps", "7"
    )  # the plain resume works


def wandb_config(segment: Path) -> dict:
    """The run config an offline wandb segment recorded (its `config` records, parsed as the history is)."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    data = next(segment.glob("run-*.wandb")).read_bytes()
    pos, block, payload, config = 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            if record.WhichOneof("record_type") == "config":
                config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return config


def test_wandb_config_holds_the_trainer_settings(tiny_run):
    config = wandb_config(next((tiny_run / "wandb").glob("offline-run-*")))
    trainer = config["trainer"]["value"] if "value" in config["trainer"] else config["trainer"]
    assert trainer["max_steps"] == 6 and trainer["val_check_interval"] == 3, trainer
    assert "logger" not in trainer
