"""A load takes about the model's own memory, as llama.cpp's does: a GGUF file whose matrices stay in their
blocks builds no float32 model first (that detour took 6x a Q4_K_M file at 1 B parameters), and a Hugging Face
folder's safetensors are read one tensor at a time (not the whole file beside the model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import GPT, ModelConfig
from tests.interop.test_keep_quantized import quantized_gguf

ROOT = Path(__file__).resolve().parents[2]
# Peak growth of the process while loading: the loaded model's own bytes and this much for the tensor being
# converted (its raw block bytes, unpacked codes, the file's pages it read: each matrix's are dropped after it).
# Measured on this model: 28 MiB against 18 MiB of model and a 16 MiB file (42 MiB while the file's pages stayed
# resident); the float detour this guards against (a float32 model built first), 201 MiB.
TRANSIENT_BYTES = 16 * 2**20
# A Hugging Face folder's: its largest tensor (gate_up, 8 MiB) copied in parts, joined, and the file's pages read
# for it. Measured: 131 MiB against 117 MiB of model; 203 MiB when the whole file was read before the model.
HF_TRANSIENT_BYTES = 32 * 2**20

MEASURE = """
import gc, json, sys
import torch
from cpu_kernels.library import row_product_op
from interop import load
row_product_op()  # the C++ kernel's library loaded (or built) before the measurement
# A first load touches the code pages of every op it runs, which count as resident memory; the second is measured.
keep = sys.argv[1].endswith(".gguf")
del load(sys.argv[1], keep_quantized=keep).model
gc.collect()

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size (VmHWM) starts again from now
before = status("VmRSS:")
model = load(sys.argv[1], keep_quantized=keep).model
tensors = [*model.parameters(), *model.buffers()]
print(json.dumps({"peak": status("VmHWM:") - before, "model": sum(t.nbytes for t in tensors),
                  "float": any(isinstance(m, torch.nn.Linear) for m in model.modules())}))
"""


def resettable_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not resettable_peak(), reason="needs Linux's /proc/self/clear_refs to reset the peak RSS")
def test_a_kept_block_load_peaks_near_the_models_own_bytes(tokenizer, tmp_path):
    pytest.importorskip("gguf")
    measured = measure_load(quantized_gguf(tmp_path / "q4.gguf", random_model(tokenizer), tokenizer, "Q4_0"))
    assert not measured["float"]  # every matrix kept: the bound is about the blocks
    bound = measured["model"] + TRANSIENT_BYTES
    assert measured["peak"] <= bound, (
        f"{measured['peak'] / 2**20:.0f} MiB > {bound / 2**20:.0f} MiB: {measured}"
    )


@pytest.mark.skipif(not resettable_peak(), reason="needs Linux's /proc/self/clear_refs to reset the peak RSS")
def test_a_hugging_face_folder_load_peaks_near_the_models_own_bytes(tokenizer, tmp_path):
    from interop.export_hf import export_hf

    measured = measure_load(export_hf(random_model(tokenizer), tokenizer, tmp_path / "hf"))
    bound = measured["model"] + HF_TRANSIENT_BYTES
    assert measured["peak"] <= bound, (
        f"{measured['peak'] / 2**20:.0f} MiB > {bound / 2**20:.0f} MiB: {measured}"
    )


def random_model(tokenizer) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=8, n_head=8, n_kv_head=2,
                           n_embd=512, mlp_hidden=2048))  # fmt: skip


def measure_load(path: Path) -> dict:
    """The load's peak growth of the resident size, the loaded model's bytes, and whether a float linear layer
    is left, measured in a fresh process."""
    # Blocks of 64 KiB and up are mapped and unmapped on their own, so freed memory leaves the resident size and
    # its peak is the live memory's (glibc would otherwise keep freed blocks, and a second load would reuse them).
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True,
                            cwd=ROOT, env=environ, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])
