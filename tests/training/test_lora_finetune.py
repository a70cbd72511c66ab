"""LoRA through train.py on the session's tiny run as the base: the checkpoint holds the adapters and names the
base, a SIGTERM and resume ends on the straight run's adapters and AdamW state exactly, a changed base is one
line, and the run loads for sampling as base + adapters. QLoRA: the same on a Q8_0 GGUF's kept blocks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoints.format import LORA_KEY, META_KEY, STATE_PREFIX
from common.errors import EXIT_USER_ERROR, UserError
from cpu_kernels.quantized import QuantizedLinear
from interop import load, resolve, source_sha256
from model.lora import LoRAConfig, LoRALinear, adapters, add_lora, merge_lora

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS, STOP_AT = 6, 3
LORA = ["--model.lora_rank", "4", "--model.lora_dropout", "0.1", "--model.learning_rate", "1e-2",
        "--trainer.max_steps", str(MAX_STEPS), "--checkpoint.every_n_train_steps", "1000", "--samples.every_n_steps",
        "0", "--attention_maps.every_n_steps", "0", "--trainer.logger", "false", "--score_tokens", "0",
        "--trainer.limit_val_batches", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def base(tiny_run, tmp_path_factory) -> Path:
    """A copy of the tiny run's checkpoint: the tests change it."""
    path = tmp_path_factory.mktemp("base") / "base.ckpt"
    shutil.copyfile(tiny_run / "checkpoints" / "last.ckpt", path)
    return path


@pytest.fixture(scope="module")
def straight(base, tiny_args, tmp_path_factory, script) -> Path:
    root = tmp_path_factory.mktemp("lora")
    script(*tiny_args(root, "--model.init_from", str(base), *LORA))
    return root / "tiny"


def last(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == MAX_STEPS
    return ckpt


def test_the_checkpoint_holds_the_adapters_and_names_the_base(straight, base):
    ckpt = last(straight)
    assert ckpt["state_dict"] and all(name.endswith((".lora_a", ".lora_b")) for name in ckpt["state_dict"])
    lora = ckpt[META_KEY][LORA_KEY]
    assert (lora["rank"], lora["targets"], lora["keep_quantized"]) == (
        4,
        ["qkv", "proj", "gate_up", "down"],
        False,
    )
    assert lora["base"]["name"] == str(base) and lora["base"]["sha256"] == source_sha256(resolve(base))
    assert all(state["step"] == MAX_STEPS for state in ckpt["optimizer_states"][0]["state"].values())
    assert len(ckpt["optimizer_states"][0]["state"]) == len(
        ckpt["state_dict"]
    )  # AdamW holds the adapters only
    assert any(
        t.abs().sum() > 0 for n, t in ckpt["state_dict"].items() if n.endswith("lora_b")
    )  # they learned


def test_the_run_loads_as_its_base_plus_its_adapters(straight, base):
    ids = torch.randint(0, 300, (1, 16))
    model = add_lora(load(base).model, LoRAConfig(rank=4, dropout=0.0))
    state = {n.removeprefix(STATE_PREFIX): t for n, t in last(straight)["state_dict"].items()}
    model.load_state_dict(state, strict=False)
    loaded = load(straight).model  # what generate.py samples: the adapters merged into the float base
    assert not adapters(loaded)
    torch.testing.assert_close(loaded(ids), model.eval()(ids), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(loaded(ids), load(base).model(ids), atol=1e-4)


@pytest.mark.slow
def test_sigterm_then_resume_ends_on_the_straight_runs_adapters_and_optimizer(
    straight, base, tiny_args, tmp_path
):
    pause = {"class_path": "tests.training.pause_at_step.PauseAtStep", "init_args": {"step": STOP_AT}}
    args = tiny_args(
        tmp_path, "--model.init_from", str(base), *LORA, f"--trainer.callbacks+={json.dumps(pause)}"
    )
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ))  # fmt: skip
    assert any("paused at step" in line for line in proc.stdout), proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    resumed = subprocess.run([sys.executable, *tiny_args(tmp_path, "--model.init_from", str(base), *LORA,
                              "--ckpt_path", "last")], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours, theirs = last(tmp_path / "tiny"), last(straight)
    assert ours["state_dict"].keys() == theirs["state_dict"].keys()
    for name, tensor in theirs["state_dict"].items():
        assert torch.equal(tensor, ours["state_dict"][name]), name
    for key, state in theirs["optimizer_states"][0]["state"].items():
        for field, value in state.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(ours["optimizer_states"][0]["state"][key][field])
            )


def test_a_resume_on_another_base_is_one_line(tiny_run, tiny_args, tmp_path, script):
    base = tmp_path / "base.ckpt"
    shutil.copyfile(tiny_run / "checkpoints" / "last.ckpt", base)
    args = tiny_args(tmp_path, "--model.init_from", str(base), *LORA)
    script(*args, "--trainer.max_steps", "2")
    # The same name, other weights: the tiny run's step-3 checkpoint.
    shutil.copyfile(tiny_run / "checkpoints" / "step-00000003.ckpt", base)
    result = script(*args, "--trainer.max_steps", "4", "--ckpt_path", "last", check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == EXIT_USER_ERROR and len(errors) == 1, result.stderr[-3000:]
    assert f"were trained on {base}" in errors[0] and "now holds other weights" in errors[0], errors[0]
    with pytest.raises(UserError, match="now holds other weights"):  # and sampling from it says the same
        load(tmp_path / "tiny")


def test_a_resume_without_the_adapters_key_is_one_line(straight, tiny_args, tmp_path, script):
    run = tmp_path / "tiny"
    shutil.copytree(straight, run)
    result = script(*tiny_args(tmp_path, "--model.lora_rank", "0", "--ckpt_path", str(run)), check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == EXIT_USER_ERROR and len(errors) == 1, result.stderr[-3000:]
    assert "adapters of rank 4" in errors[0] and "lora_rank" in errors[0]


def test_qlora_trains_on_the_kept_blocks_and_samples_from_them(tiny_run, tiny_args, tmp_path, script):
    pytest.importorskip("gguf")
    from interop.export_gguf import export_gguf

    loaded = load(tiny_run)
    gguf = export_gguf(loaded.model, loaded.tokenizer, tmp_path / "base.q8_0.gguf", dtype="q8_0")
    result = script(*tiny_args(tmp_path, "--model.init_from", str(gguf), *LORA, "--model.keep_quantized", "true",
                               "--trainer.max_steps", "2"))  # fmt: skip
    assert "frozen matrices kept in their blocks" in result.stderr
    ckpt = torch.load(tmp_path / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt[META_KEY][LORA_KEY]["keep_quantized"] is True
    model = load(tmp_path / "tiny").model
    kept = [a for a in adapters(model).values() if isinstance(a.base, QuantizedLinear)]
    assert kept and len(kept) == len(adapters(model))  # the adapters sit on the kept blocks, as trained
    merged = merge_lora(load(tmp_path / "tiny").model)
    ids = torch.randint(0, 300, (1, 12))
    torch.testing.assert_close(model(ids), merged(ids), rtol=1e-4, atol=1e-4)
    assert isinstance(model.blocks[0].attn.qkv, LoRALinear)


def test_the_peft_folder_loads_in_peft_with_our_logits_and_greedy_tokens(straight, base, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from generation.sampling import GREEDY, generate
    from interop.export_hf import export_hf
    from interop.export_lora import main

    assert main(["--checkpoint", str(straight), "--out", str(tmp_path / "adapter")]) == 0
    pretrained = load(base)
    hf_folder = export_hf(pretrained.model, pretrained.tokenizer, tmp_path / "base-hf")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, torch_dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    ours = load(straight).model  # base + adapters, merged
    ids = torch.randint(0, ours.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)
        with theirs.disable_adapter():  # the adapters are what made the difference
            assert not torch.allclose(theirs(ids).logits, ours(ids), atol=1e-3)
        prompt = ids[:1, :8]
        ours_greedy = generate(ours, prompt, 16, sampler=GREEDY)[0].tolist()
        theirs_greedy = theirs.generate(
            input_ids=prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False
        )
    assert theirs_greedy[0].tolist() == ours_greedy


def test_export_lora_of_a_run_without_adapters_is_one_line(tiny_run, tmp_path, capsys):
    from interop.export_lora import main

    assert main(["--checkpoint", str(tiny_run), "--out", str(tmp_path / "adapter")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds every weight, not adapters" in err and "export_hf" in err, err
    assert not (tmp_path / "adapter").exists()
