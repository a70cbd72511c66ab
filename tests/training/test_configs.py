"""Every shipped config trains on CPU through train.py, shrunk only by command-line overrides.

Each YAML key must (1) reach the resolved config unchanged unless overridden and (2) be seen in use: in the
checkpoint's hyperparameters (model, data) or in what the Trainer and callbacks actually ran with (RunFacts).
The GPU configs keep bf16-mixed (CPU autocast), their GQA head counts, vocab sizes, strategy and streaming;
Hub datasets and the SmolLM2 recipes' Hub model are replaced by local stand-ins (tests/training/config_cases.py).
tinystories keeps `compile: true` (inductor on CPU: one compile of a 2-layer model); gpt2-small turns it off,
because its 2 DDP processes would each compile on CI's 2 cores for no extra coverage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.training.config_cases import CASES, CONFIGS, TINY_OVERRIDES, flatten, overrides, run_config

pytestmark = pytest.mark.slow  # train.py runs in subprocesses here

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


@pytest.fixture(scope="module")
def config_run(corpus, tmp_path_factory, request):
    """config name -> (run dir, shipped YAML as flat keys, overridden keys); each config trains once."""
    runs: dict[str, tuple[Path, dict, set[str]]] = {}

    def run(name: str) -> tuple[Path, dict, set[str]]:
        if name not in runs:
            work = tmp_path_factory.mktemp(name)
            runs[name] = run_config(name, corpus, work, lambda: request.getfixturevalue("smollm2_hf"))
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
    # mmap: SmolLM2's last.ckpt (weights and AdamW state) is 1.6 GB; only the metadata below is read.
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
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
