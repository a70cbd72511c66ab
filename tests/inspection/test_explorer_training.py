"""train.py's AttentionMaps callback: the explorer in the run directory and in wandb, and induction formations.

One 3-step run with the induction threshold at -1, so every head "forms" at the first attention step: the
formation must be printed and put in the wandb summary once per head, never again at steps 2 and 3.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch

from training.attention_maps import AttentionMaps

N_LAYER, N_HEAD = 2, 4  # configs/tiny.yaml


@pytest.fixture(scope="module")
def formation_run(tmp_path_factory, tiny_args, script):
    root = tmp_path_factory.mktemp("formation")
    result = script(*tiny_args(
        root, "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--samples.every_n_steps", "0",
        "--attention_maps.every_n_steps", "1", "--attention_maps.induction_threshold", "-1",
    ))  # fmt: skip
    return root / "tiny", result.stdout + result.stderr


def read_wandb_records(run_dir: Path, kind: str) -> list[dict]:
    """The items of every `kind` record ("history", "summary") of an offline run, in the order written.

    Same framing as tests/conftest.py's read_wandb_history (LevelDB-style 32 KiB blocks of protobuf Records).
    """
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    pos, block, payload, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, chunk = struct.unpack("<IHB", data[pos : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if chunk in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            if record.WhichOneof("record_type") == kind:
                items = record.history.item if kind == "history" else record.summary.update
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return out


def meta_of(page: str) -> dict:
    return json.loads(
        re.search(r'<script id="explorer-meta" type="application/json">(.*?)</script>', page, re.S)[1]
    )


def test_each_formation_is_printed_once_at_its_step(formation_run):
    _, output = formation_run
    lines = re.findall(r"induction head (L\d+H\d+) formed at step (\d+)", output)
    assert sorted(lines) == sorted(
        (f"L{layer}H{head}", "1") for layer in range(N_LAYER) for head in range(N_HEAD)
    )


def test_each_formation_goes_to_the_wandb_summary_once(formation_run):
    run = next((formation_run[0] / "wandb").glob("offline-run-*"))
    updates = [(k, v) for record in read_wandb_records(run, "summary") for k, v in record.items()
               if k.startswith("attention/induction_formed/")]  # fmt: skip
    expected = [
        (f"attention/induction_formed/L{layer}H{head}", 1)
        for layer in range(N_LAYER)
        for head in range(N_HEAD)
    ]
    assert sorted(updates) == sorted(expected)


def test_wandb_panel_is_the_explorer_in_the_run_directory(formation_run):
    run_dir = formation_run[0]
    run = next((run_dir / "wandb").glob("offline-run-*"))
    logged = {row["trainer/global_step"]: row["attention/explorer/path"]
              for row in read_wandb_records(run, "history") if "attention/explorer/path" in row}  # fmt: skip
    assert sorted(logged) == [1, 2, 3]
    pages = {step: (run / "files" / path).read_text(encoding="utf-8") for step, path in logged.items()}
    assert pages[3] == (run_dir / "attention" / "explorer.html").read_text(encoding="utf-8")
    for step, page in pages.items():
        meta = meta_of(page)
        assert meta["step"] == step and [h["step"] for h in meta["history"]] == list(range(1, step + 1))
        assert len(meta["formations"]) == N_LAYER * N_HEAD and {f["step"] for f in meta["formations"]} == {1}


def test_a_resumed_callback_remembers_history_and_formations():
    first = AttentionMaps(induction_threshold=0.5)
    first.history.append((10, {"induction": torch.tensor([[0.1, 0.7]])}))
    first.detector.update(10, torch.tensor([[0.1, 0.7]]))
    resumed = AttentionMaps(induction_threshold=0.5)
    resumed.load_state_dict(first.state_dict())
    assert resumed.detector.update(20, torch.tensor([[0.2, 0.8]])) == []  # L0H1 formed before the resume
    assert [step for step, _ in resumed.history] == [10]
    assert torch.equal(resumed.history[0][1]["induction"], torch.tensor([[0.1, 0.7]]))
