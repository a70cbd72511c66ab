"""Fine-tuning with --model.init_from: a tiny random transformers Llama (tests/interop/conftest.py) trained on
the test corpus through train.py and configs/finetune-smollm2.yaml.

One straight run serves several checks: its step-0 weights (dumped before the first optimizer step) equal the
pretrained ones, its attention explorer comes from its final weights, its checkpoint exports to Hugging Face
with transformers' logits, and a run stopped by SIGTERM and resumed ends with the same weights, exactly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from checkpoints.format import load_checkpoint
from common.errors import EXIT_USER_ERROR
from data.tokenizer import Tokenizer
from inspection.explorer import probe_attention
from interop import load_hf
from model import GPT
from tests.interop.conftest import save_llama
from tests.tiny_models import running_in_ci

ROOT = Path(__file__).resolve().parents[2]
RUN = "finetune-smollm2"  # the run directory is named after the config
MAX_STEPS, STOP_AT = 8, 3
# A high learning rate, so 8 steps move the attention of the tiny model well beyond float noise.
COMMON = ["--data.block_size", "32", "--data.batch_size", "4", "--model.learning_rate", "3e-3",
          "--model.warmup_steps", "2", "--trainer.max_steps", str(MAX_STEPS), "--trainer.limit_val_batches", "0",
          "--samples.every_n_steps", "0", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--attention_maps.every_n_steps", str(MAX_STEPS), "--checkpoint.every_n_train_steps", "1000"]  # fmt: skip


class WeightsAtStart(L.Callback):
    """Saves the model's weights as the first training batch starts, before any optimizer step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            torch.save({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}, self.path)


@pytest.fixture(scope="module")
def hf_transformers():
    if running_in_ci():
        import transformers
    else:
        transformers = pytest.importorskip("transformers")
    return transformers


@pytest.fixture(scope="module")
def llama(hf_transformers, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pretrained") / "llama"
    save_llama(hf_transformers, folder, shard=False)
    return folder


@pytest.fixture(scope="module")
def finetune_args(llama, corpus, tmp_path_factory):
    cache = tmp_path_factory.mktemp("finetune-cache")

    def build(root: Path, *extra: str) -> list[str]:
        return ["train.py", "fit", "--config", "configs/finetune-smollm2.yaml", "--model.init_from", str(llama),
                "--data.data_files", str(corpus), "--data.cache_dir", str(cache),
                "--trainer.default_root_dir", str(root), *COMMON, *extra]  # fmt: skip

    return build


@pytest.fixture(scope="module")
def straight(finetune_args, tmp_path_factory, script):
    """(run dir, stderr) of an uninterrupted run that dumped its weights at step 0."""
    root = tmp_path_factory.mktemp("straight")
    dump = {
        "class_path": "tests.training.test_finetune.WeightsAtStart",
        "init_args": {"path": str(root / "start.pt")},
    }
    result = script(*finetune_args(root, f"--trainer.callbacks+={json.dumps(dump)}"))
    return root / RUN, result.stderr


def final_weights(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    return ckpt["state_dict"]


@pytest.mark.slow
def test_step0_weights_are_the_pretrained_ones(straight, llama):
    run_dir, stderr = straight
    assert f"init_from: weights of {llama}" in stderr
    start = torch.load(run_dir.parent / "start.pt", weights_only=True)
    pretrained = load_hf(llama).state_dict()
    assert start.keys() == pretrained.keys()
    for name, tensor in pretrained.items():
        assert torch.equal(start[name], tensor), name
    trained = final_weights(run_dir)
    assert not torch.equal(trained["model.wte.weight"], pretrained["wte.weight"])  # training moved them


@pytest.mark.slow
def test_checkpoint_embeds_the_pretrained_tokenizer(straight, llama):
    from interop import read_tokenizer

    loaded = load_checkpoint(straight[0] / "checkpoints" / "last.ckpt")
    tokenizer = Tokenizer.from_json(loaded.tokenizer_json)
    assert tokenizer.sha256 == read_tokenizer(llama).sha256
    assert (tokenizer.bos_id, tokenizer.add_bos, tokenizer.eos_ids) == (1, True, (2, 3))
    assert loaded.model.config.block_size == 128  # the pretrained context, not data.block_size (32)


@pytest.mark.slow
def test_sigterm_then_resume_equals_the_straight_run(straight, finetune_args, tmp_path):
    pause = {"class_path": "tests.training.pause_at_step.PauseAtStep", "init_args": {"step": STOP_AT}}
    args = finetune_args(tmp_path, f"--trainer.callbacks+={json.dumps(pause)}")
    with open(tmp_path / "stderr.txt", "w+") as stderr_file:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr_file,
                                text=True, env=dict(os.environ))  # fmt: skip
        cue = next((line for line in proc.stdout if "paused at step" in line), None)
        assert cue is not None, (tmp_path / "stderr.txt").read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    assert proc.returncode == 143, stderr[-2000:]
    assert int(re.search(r"SIGTERM\b.*\bstep (\d+)", stderr)[1]) == STOP_AT
    resumed = subprocess.run([sys.executable, *finetune_args(tmp_path, "--ckpt_path", "last")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "init_from: weights of" not in resumed.stderr  # the resume restored our checkpoint only
    ours, theirs = final_weights(tmp_path / RUN), final_weights(straight[0])
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(tensor, ours[name]), name


@pytest.mark.slow
def test_attention_explorer_shows_the_finetuned_weights(straight, llama):
    run_dir, _ = straight
    page = (run_dir / "attention" / "explorer.html").read_text(encoding="utf-8")
    meta = json.loads(
        re.search(r'<script id="explorer-meta" type="application/json">(.*?)</script>', page, re.S)[1]
    )
    assert meta["step"] == MAX_STEPS
    loaded = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    tokenizer = Tokenizer.from_json(loaded.tokenizer_json)
    from training.attention_maps import DEFAULT_PROBE

    ids = torch.tensor([tokenizer.encode(DEFAULT_PROBE)[: loaded.model.config.block_size]])

    def statistics(model: GPT) -> dict[str, torch.Tensor]:
        _, stats = probe_attention(model.eval(), ids, 32, generator=torch.Generator().manual_seed(0))
        return stats

    shown = {name: torch.tensor(values) for name, values in meta["stats"].items()}
    finetuned, initial = statistics(loaded.model), statistics(load_hf(llama))
    for name in ("entropy", "sink_mass", "previous_token"):
        assert torch.allclose(shown[name], finetuned[name].float(), atol=1e-4), name
    assert (shown["entropy"] - initial["entropy"]).abs().max() > 1e-2  # not the pretrained model's maps


@pytest.mark.slow
def test_finetuned_checkpoint_exports_to_hf_with_logit_parity(straight, hf_transformers, script, tmp_path):
    run_dir, _ = straight
    script("-m", "interop.export_hf", "--checkpoint", str(run_dir), "--out", str(tmp_path / "hf"))
    ours = load_checkpoint(run_dir / "checkpoints" / "last.ckpt").model.eval()
    theirs = hf_transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (ours(ids) - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4


def other_tokenizer_file(tmp_path: Path) -> Path:
    path = tmp_path / "ours.json"
    Tokenizer.train(["the cat sat on the mat"] * 50, 300, show_progress=False).save(path)
    return path


BAD_INPUTS = {
    "tokenizer_path": (
        lambda tmp: ["--data.tokenizer_path", str(other_tokenizer_file(tmp))],
        "data.tokenizer_path",
    ),
    "vocab_size": (lambda tmp: ["--data.vocab_size", "512"], "data.vocab_size=512"),
    "block_size": (lambda tmp: ["--data.block_size", "256"], "data.block_size=256"),
    "n_layer": (lambda tmp: ["--model.n_layer", "3"], "model.n_layer=3"),
    "n_embd": (lambda tmp: ["--model.n_embd", "128"], "model.n_embd=128"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(case, finetune_args, tmp_path, monkeypatch, capsys):
    import train

    extra, words = BAD_INPUTS[case]
    args = finetune_args(tmp_path / "runs", *extra(tmp_path))
    cache = tmp_path / "cache"
    args[args.index("--data.cache_dir") + 1] = str(cache)
    monkeypatch.setattr(sys, "argv", args)
    code = train.main()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == EXIT_USER_ERROR and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert words in errors[0] and "init_from" in errors[0], errors[0]
    assert not (tmp_path / "runs").exists() and not cache.exists()


def test_unknown_name_is_interops_line(finetune_args, tmp_path, monkeypatch, capsys):
    import train

    args = finetune_args(tmp_path / "runs")
    args[args.index("--model.init_from") + 1] = str(tmp_path / "no-such-model")
    monkeypatch.setattr(sys, "argv", args)
    assert train.main() == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'no-such-model'}: no such file"), err
    assert not (tmp_path / "runs").exists()


def test_the_models_own_tokenizer_file_is_accepted(llama):
    from jsonargparse import Namespace

    from training.init_from import apply_init_from

    config = Namespace(
        model=Namespace(init_from=str(llama), init_revision=None, n_layer=4),
        data=Namespace(vocab_size=1024, block_size=64, tokenizer_path=str(llama / "tokenizer.json")),
    )
    pretrained = apply_init_from(config, {"data": {"tokenizer_path": str(llama / "tokenizer.json")}})
    assert config.data.tokenizer_path is None and config.data.vocab_size == 300
    assert config.model.n_layer == 2 and config.model.block_size == 128  # filled from the model
    assert pretrained.tokenizer.bos_id == 1
