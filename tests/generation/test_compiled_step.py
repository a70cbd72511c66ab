"""The compiled decode step is kept between processes (generation/compiled_step.py): the next process loads it
instead of building it, another shape is built anew, a damaged or stale file is built again after one note, and
generate.py decodes eagerly by default, and with the kept step (one note) under --compile.

The subprocess tests compile with inductor (slow); the others trace with "aot_eager", whose compiled function
torch saves and loads as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import generation.compiled_step as store
import generation.static_decode as static_decode
from generation.sampling import GREEDY, generate
from tests.benchmarks.test_smoke import run_benchmark
from tests.conftest import ROOT, TEST_ENV
from tests.conftest import run_generate as run_cli
from tests.generation.test_generate_ux import gguf_of  # noqa: F401 (fixture)
from tests.model.lively import lively_model

BUILD = """import sys
from generation.compiled_step import compiled_step
from tests.model.lively import lively_model
compiled_step(lively_model(int(sys.argv[1]), block_size=32), 1, 8)
"""


def build_in_a_process(tmp_path, n_kv_head: int, inductor: str) -> str:
    """stderr of a fresh process compiling a tiny model's step, keeping it under tmp_path/kept."""
    folders = {store.DIR_ENV: str(tmp_path / "kept"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / inductor)}
    env = {**os.environ, **TEST_ENV, **folders, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BUILD, str(n_kv_head)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.slow
def test_the_next_process_loads_the_kept_step_and_another_shape_is_built(tmp_path):
    assert "compiled the decode step in" in build_in_a_process(tmp_path, 2, "inductor1")
    # An empty Inductor cache: only the kept file can spare the second process its build.
    again = build_in_a_process(tmp_path, 2, "inductor2")
    assert "the kept compiled step" in again and "compiled the decode step" not in again, again
    assert "compiled the decode step in" in build_in_a_process(tmp_path, 1, "inductor2")  # other head layout
    assert len(list((tmp_path / "kept").glob("*.bin"))) == 2


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """Every decoder asked for inductor traces with aot_eager (no kernels built), in a tmp folder; the steps
    compiled."""
    built, compile, decoder = [], torch.compile, static_decode.StaticDecoder
    monkeypatch.setenv(store.DIR_ENV, str(tmp_path / "kept"))
    monkeypatch.setattr(
        static_decode, "StaticDecoder", lambda model, cache, **kw: decoder(model, cache, backend="aot_eager")
    )
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: built.append(fn) or compile(fn, **kw))
    return built


DAMAGE = {
    "garbage": lambda data: os.urandom(len(data)),
    "truncated": lambda data: data[:-3],
    "other torch": lambda data: data.replace(torch.__version__.encode(), b"1.0.0", 1),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_or_stale_file_is_built_again_after_one_note(traced, capsys, damage):
    model = lively_model(block_size=32)
    store.compiled_step(model, 1, 8)
    path, key = store.artifact(model, 1, 8)
    assert json.loads(path.read_bytes().partition(b"\n")[0])["key"] == key
    path.write_bytes(damage(path.read_bytes()))
    capsys.readouterr()
    store.compiled_step(model, 1, 8)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "is damaged" in line]
    assert len(notes) == 1 and str(path) in notes[0] and "compiled the decode step in" in err, err
    store.compiled_step(model, 1, 8)  # built and kept again: now loaded
    assert "the kept compiled step" in capsys.readouterr().err


def test_a_kept_step_decodes_another_model_of_its_shape_with_that_models_weights(traced, capsys):
    """The key holds no weights, so a fine-tuned checkpoint loads the step its base built: the step must read the
    weights it is called with, not ones saved with it."""
    built_for, other = lively_model(block_size=32, seed=0), lively_model(block_size=32, seed=1)
    prompt = torch.tensor([[3, 14, 15, 92]])
    store.compiled_step(built_for, 1, 16)
    assert store.artifact(other, 1, 16) == store.artifact(built_for, 1, 16)
    capsys.readouterr()
    store.compiled_step(other, 1, 16)
    assert "the kept compiled step" in capsys.readouterr().err
    compiled = generate(other, prompt, 12, sampler=GREEDY, compile=True)
    assert torch.equal(compiled, generate(other, prompt, 12, sampler=GREEDY))
    assert not torch.equal(compiled, generate(built_for, prompt, 12, sampler=GREEDY))  # the two models differ


def test_the_key_follows_the_shape_batch_dtype_and_length():
    model, path = lively_model(block_size=1024), store.artifact(lively_model(block_size=1024), 1, 8)[0]
    assert store.artifact(model, 1, 200) == store.artifact(model, 1, 8)  # one static length, 256
    others = [store.artifact(model, 2, 8), store.artifact(model, 1, 300), store.artifact(model.float(), 1, 8)]
    others.append(store.artifact(lively_model(1, block_size=1024), 1, 8))
    assert len({path, *(p for p, _ in others)}) == 5


def test_the_key_follows_every_file_the_step_is_built_from(monkeypatch, tmp_path):
    names = {path.relative_to(ROOT).as_posix() for path in store.step_sources()}
    expected = {
        "model/gpt.py",
        "cpu_kernels/row_kernel.cpp",
        "cpu_kernels/library.py",
        "generation/static_decode.py",
    }
    assert expected <= names
    model, sources = lively_model(), store.step_sources()
    before = store.artifact(model, 1, 8)
    copy = tmp_path / "row_kernel.cpp"
    copy.write_bytes(ROOT.joinpath("cpu_kernels/row_kernel.cpp").read_bytes() + b"// changed")
    changed = [copy if path.name == copy.name else path for path in sources]  # the kernel's source edited
    monkeypatch.setattr(store, "step_sources", lambda: changed)
    assert store.artifact(model, 1, 8) != before


def test_generate_decodes_eagerly_by_default_and_with_the_kept_step_under_compile(traced, gguf_of, capsys):  # noqa: F811
    """A kept step is used only when asked: its load costs seconds, which a short generation does not win back."""
    argv = ["--checkpoint", gguf_of(), "--prompt", "a b", "--max_new_tokens", "8", "--temperature", "0"]
    code, eager, err = run_cli(capsys, *argv)
    assert code == 0 and "note:" not in err and traced == []  # nothing kept: eager, no compile
    code, _, err = run_cli(capsys, *argv, "--compile")
    assert code == 0 and "compiling the decode step" in err and "compiled the decode step in" in err, err
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and out == eager and "note:" not in err and len(traced) == 1  # kept, but not asked for
    code, out, err = run_cli(capsys, *argv, "--compile")
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert code == 0 and out == eager and len(notes) == 1 and "the kept compiled step" in notes[0], err
    assert len(traced) == 2  # one step a process: the one compiled_step prepares is the one generate runs


@pytest.mark.slow
def test_first_token_benchmark_runs(tmp_path, ckpt):
    out = run_benchmark(tmp_path, "first_token", "--model", ckpt, "--repeats", "1", timeout=900)
    assert "float32: eager" in out and "warm/cold" in out
