"""train.py end to end: checkpoints, offline wandb files, attention images, config errors, --help."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from model import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_writes_a_self_contained_checkpoint(tiny_run):
    checkpoints = sorted(p.name for p in (tiny_run / "checkpoints").glob("*.ckpt"))
    assert checkpoints == [
        "last.ckpt",
        "step-00000003.ckpt",
        "step-00000006.ckpt",
    ]  # keep_last 2, last = newest
    assert (tiny_run / "checkpoints" / "last.ckpt").samefile(tiny_run / "checkpoints" / "step-00000006.ckpt")
    ckpt = torch.load(tiny_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6
    meta = ckpt["gqa_gpt"]
    assert meta["model_config"]["n_layer"] == 2 and meta["model_config"]["n_kv_head"] == 2
    assert meta["tokenizer_json"].startswith("{") and len(meta["tokenizer_sha256"]) == 64
    assert meta["data"]["block_size"] == 64
    assert (tiny_run / "config.yaml").is_file()


def logged(history: list[dict], key: str) -> dict[int, object]:
    """{global step: value} of one key across the history rows."""
    return {row["trainer/global_step"]: row[key] for row in history if key in row}


def test_tiny_run_logs_metrics_offline(tiny_run, wandb_history):
    runs = list((tiny_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history = wandb_history(runs[0])
    for key in ("train/loss", "val/loss", "val/bpb", "train/grad_norm", "train/lr", "train/tokens_per_s"):
        assert logged(history, key), key
    val = logged(history, "val/loss")
    assert set(val) == {3, 6}  # validation every 3 steps, logged at the 1-based step the console shows
    assert all(np.isfinite(v) and 0 < v < 7 for v in val.values())


def test_attention_images_logged_for_every_step_and_layer(tiny_run, wandb_history):
    run = next((tiny_run / "wandb").glob("offline-run-*"))
    history = wandb_history(run)
    for layer in (0, 1):
        assert set(logged(history, f"attention/layer_{layer}/_type")) == {1, 2, 3, 4, 5, 6}
    assert set(logged(history, "attention/heads/_type")) == {1, 2, 3, 4, 5, 6}
    for name in ("entropy", "sink_mass", "previous_token", "induction"):  # one chart per statistic
        assert set(logged(history, f"attention/{name}_table/_type")) == {1, 2, 3, 4, 5, 6}, name
    assert not [key for row in history for key in row if key.startswith("attention/induction/L")]
    images = sorted((run / "files" / "media" / "images" / "attention").glob("layer_*.png"))
    assert len(images) == 12  # 6 steps x 2 layers
    pixels = np.asarray(Image.open(images[0]).convert("RGB"), dtype=np.float32)
    assert pixels.std() > 10  # neither all black nor all white


def test_a_second_fit_into_the_same_run_is_refused(tiny_run, script, tiny_args):
    before = {p: p.stat().st_mtime_ns for p in (tiny_run / "checkpoints").glob("*.ckpt")}
    result = script(*tiny_args(tiny_run.parent), check=False)
    assert result.returncode == 2
    assert (
        "already holds checkpoints" in result.stderr and "python train.py fit --ckpt_path " in result.stderr
    )
    assert {p: p.stat().st_mtime_ns for p in (tiny_run / "checkpoints").glob("*.ckpt")} == before


@pytest.mark.parametrize(
    ("override", "keys"),
    [
        (["--model.n_layer", "two"], ["model.n_layer"]),
        (["--model.n_layers", "2"], ["model.n_layers"]),
        (["--model.n_head", "3"], ["n_embd", "n_head"]),
        (["--model.block_size", "32"], ["model.block_size", "data.block_size"]),
        (["--data.vocab_size", "100"], ["data.vocab_size"]),
    ],
    ids=["wrong-type", "unknown-key", "indivisible-heads", "block-size-mismatch", "vocab-too-small"],
)
def test_config_errors_are_one_line_naming_the_keys(override, keys, script, tiny_args, tmp_path):
    result = script(*tiny_args(tmp_path, *override), check=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert all(key in errors[0] for key in keys), errors[0]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


def test_tokenizer_larger_than_the_vocab_is_refused(tiny_run, script, tiny_args, tmp_path):
    ckpt = torch.load(tiny_run / "checkpoints" / "last.ckpt", weights_only=True)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(ckpt["gqa_gpt"]["tokenizer_json"], encoding="utf-8")
    overrides = ["--data.tokenizer_path", str(tokenizer), "--data.vocab_size", "300"]
    result = script(*tiny_args(tmp_path, *overrides), check=False)
    assert result.returncode == 2
    assert "data.vocab_size" in result.stderr and "Traceback" not in result.stderr


def test_help_documents_model_and_data_keys(script):
    out = script("train.py", "fit", "--help").stdout
    for key in (
        "--model.n_kv_head",
        "--model.learning_rate",
        "--data.data_files",
        "--data.vocab_size",
        "--attention_maps.every_n_steps",
        "--run_name",
    ):
        assert key in out, key
    assert "Number of key/value heads" in out


def model_config_docs() -> dict[str, str]:
    """{field: first line of its description} from the Args section of ModelConfig's docstring."""
    lines = re.findall(r"^ {8}(\w+): (.+)$", ModelConfig.__doc__, flags=re.MULTILINE)
    return dict(lines)


def test_help_documents_every_model_config_field_once(script):
    out = " ".join(script("train.py", "fit", "--help").stdout.split())  # undo the help's line wrapping
    docs = model_config_docs()
    assert set(docs) == {field.name for field in dataclasses.fields(ModelConfig)}
    for name, words in docs.items():
        assert out.count(words) == 1, (name, words)  # described once: by ModelConfig, not again by LitGPT
        settable = out.count(f" --model.{name} ") == 1
        linked = f"data.{name} --> model.{name}" in out  # vocab_size and block_size follow the data keys
        assert settable or linked, name


def test_every_model_config_field_reaches_the_model(corpus, tmp_path, monkeypatch):
    from data.datamodule import TextDataModule
    from training import LitGPT
    from training.cli import GPTCLI

    overrides = {
        "norm_eps": 1e-6,
        "init_std": 0.01,
        "rope_theta": 500.0,
        "mlp_hidden": 96,
        "dropout": 0.1,
        "tie_embeddings": False,
    }
    args = [
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--data.data_files",
        str(corpus),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger",
        "false",
    ]
    for name, value in overrides.items():
        args += [f"--model.{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    monkeypatch.setattr(sys, "argv", ["train.py"])  # only `args` is parsed, not pytest's own flags
    cli = GPTCLI(LitGPT, TextDataModule, run=False, args=args)
    config = cli.model.model.config
    assert {name: getattr(config, name) for name in overrides} == overrides
    assert config.vocab_size == cli.datamodule.vocab_size and config.block_size == cli.datamodule.block_size
