"""generation/checks.py through generate.py: each refusal is one `error:` line before any work, and the flag
combinations it must not refuse still run."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from generation import checks
from model import GPT, ModelConfig
from model.cache import cache_bytes
from tests.conftest import run_generate as run_cli

NOT_UTF8 = b"\xff\xfehi"


@pytest.mark.parametrize(
    "source", ["--prompt", "--explain_attention", "--prompt_file", "stdin", "stdin-escaped"]
)
def test_a_prompt_that_is_not_utf8_is_one_line_naming_its_source(
    gguf_of, capsys, monkeypatch, tmp_path, source
):
    args = ["--checkpoint", gguf_of(), "--max_new_tokens", "2"]
    if source.startswith("stdin"):  # strict: a decoding error; escaped (a C locale's stdin): lone surrogates
        errors = "surrogateescape" if source == "stdin-escaped" else "strict"
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NOT_UTF8), "utf-8", errors))
    elif source == "--prompt_file":
        (tmp_path / "prompt.bin").write_bytes(NOT_UTF8)
        args += [source, str(tmp_path / "prompt.bin")]
    else:  # as Python hands argv bytes that are not UTF-8 to the program
        args += [source, NOT_UTF8.decode("utf-8", "surrogateescape")]
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error:"), err
    assert "not UTF-8" in err and "0xff" in err and source.removesuffix("-escaped") in err, err


@pytest.mark.parametrize("seed", [str(2**64), str(-(2**63) - 1), "99999999999999999999999"])
def test_a_seed_out_of_torch_range_is_one_line(gguf_of, capsys, seed):
    code, out, err = run_cli(capsys, "--checkpoint", gguf_of(), "--prompt", "a", "--seed", seed)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: --seed must be in"), (
        err
    )


@pytest.mark.parametrize("seed", [str(2**64 - 1), str(-(2**63))])
def test_the_seeds_at_the_ends_of_torch_range_sample(gguf_of, capsys, seed):
    code, _, err = run_cli(
        capsys, "--checkpoint", gguf_of(), "--prompt", "a", "--max_new_tokens", "2", "--seed", seed
    )
    assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--prompt", "hi", "--benchmark", "--attention_html", "x.html"], "--benchmark measures speed"),
        (
            ["--explain_attention", "a b", "--prompt", "hi", "--attention_html", "y.html"],
            "drop --prompt, --attention_html",
        ),
        (["--explain_attention", "a b", "--max_new_tokens", "5"], "drop --max_new_tokens"),
        (["--explain_attention", "a b", "--temperature", "0.5", "--seed", "3"], "drop --temperature, --seed"),
        (["--prompt", "hi", "--prompt_file", "f.txt"], "--prompt and --prompt_file"),
        (["--prompt", "", "--prompt_file", "f.txt"], "--prompt and --prompt_file"),
        (["--prompt", "hi", "--draft_k", "3"], "drop --draft_k"),
        (["--prompt", "hi", "--layer", "1"], "drop --layer"),
        (["--prompt", "hi", "--attention_html", "z.html", "--layer", "1"], "drop --layer"),
        (["--prompt", "hi", "--head", "0"], "drop --head"),
        (["--prompt", "hi", "--force"], "drop --force"),
    ],
)
def test_a_flag_that_would_do_nothing_is_one_line_before_loading(tmp_path, capsys, argv, words):
    argv = [str(tmp_path / arg) if arg.endswith((".html", ".txt")) else arg for arg in argv]
    code, out, err = run_cli(capsys, "--checkpoint", str(tmp_path / "none.ckpt"), *argv)  # never read
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error:") and words in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--prompt", "hi", "--draft_k", "2", "--prompt_lookup"],
        [
            "--prompt",
            "hi",
            "--attention_map",
            "MAP",
            "--layer",
            "0",
            "--max_new_tokens",
            "4",
            "--num_samples",
            "1",
        ],
        ["--explain_attention", "a b", "--layer", "1", "--head", "1"],
    ],
)
def test_flags_at_their_defaults_or_with_their_partner_are_accepted(gguf_of, capsys, tmp_path, argv):
    argv = [str(tmp_path / "map.png") if arg == "MAP" else arg for arg in argv]
    code, out, err = run_cli(capsys, "--checkpoint", gguf_of(), *argv)
    assert code == 0 and out, err


def test_a_batch_too_big_for_the_free_memory_is_one_line_before_allocating(gguf_of, capsys, monkeypatch):
    monkeypatch.setattr(checks, "free_memory", lambda device: 10**6)  # 1 MB: 1000 samples' caches need more
    args = ["--checkpoint", gguf_of(), "--prompt", "a", "--max_new_tokens", "3"]
    code, out, err = run_cli(capsys, *args, "--num_samples", "1000")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert (
        err.startswith("error: --num_samples 1000: decoding 1000 x 4 tokens needs at least") and "GB" in err
    )
    assert err.endswith("pass a smaller --num_samples or --max_new_tokens\n"), err
    # One sample cannot shrink: the fix named is fewer tokens (it once said "a smaller --num_samples").
    _, _, err = run_cli(capsys, "--checkpoint", args[1], "--prompt", "a", "--max_new_tokens", str(10**9))
    assert "decoding 1 x 1000000001 tokens" in err and err.endswith("pass a smaller --max_new_tokens\n"), err
    assert run_cli(capsys, *args, "--num_samples", "2")[0] == 0  # a batch that fits is decoded
    monkeypatch.setattr(checks, "free_memory", lambda device: None)  # unknown (not Linux): no check
    assert run_cli(capsys, *args, "--num_samples", "2")[0] == 0


def test_the_batch_check_counts_the_cache_the_compiled_step_holds(monkeypatch):
    # 4 positions eagerly; the compiled step's static cache holds 256 (at least 256, a power of two): a memory
    # between the two needs lets the eager batch through and refuses the compiled one.
    model = GPT(ModelConfig(vocab_size=64, block_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    per_position = cache_bytes(model.config, 1, 4)
    monkeypatch.setattr(checks, "free_memory", lambda device: 100 * per_position)
    checks.refuse_a_batch_too_big(model, 1, 4, torch.device("cpu"), compiled=False)
    with pytest.raises(UserError, match="decoding 1 x 4 tokens needs at least"):
        checks.refuse_a_batch_too_big(model, 1, 4, torch.device("cpu"), compiled=True)


def test_the_free_memory_is_read_on_this_machine():
    free = checks.free_memory(torch.device("cpu"))
    assert free is None or 0 < free, free
    if Path("/proc/meminfo").exists():
        assert free is not None


def test_standard_output_that_cannot_be_written_is_named(gguf_of):
    # `> /dev/full`: the one line said "cannot write: No space left on device" without saying what.
    import subprocess
    import sys

    from tests.conftest import ROOT

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "generate.py", "--checkpoint", gguf_of(), "--prompt", "a",
                               "--max_new_tokens", "2"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("error: cannot write standard output: No space left"), (
        done.stderr
    )
