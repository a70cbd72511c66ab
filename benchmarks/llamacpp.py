"""llama.cpp's side of the decode benchmarks: the probe of tools/llamacpp (found, or built once) and its runs.

The probe times its own prompt pass and decode steps (tools/llamacpp/probe.cpp), so process start and model
loading are left out on llama.cpp's side, as building our model is on ours.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common.tokens import split_tokenizer_json

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "llamacpp" / "build.sh"


def probe_path() -> Path:
    """Where tools/llamacpp/build.sh keeps the probe binary (built or not)."""
    where = subprocess.run(["bash", str(BUILD_SCRIPT), "--where"], capture_output=True, text=True, check=True)
    return Path(where.stdout.strip())


def built_probe() -> Path | None:
    """The probe binary if it is built (never built here: that takes minutes)."""
    path = probe_path()
    return path if path.is_file() else None


def build_probe() -> Path:
    """The probe binary, built first when missing; the build is announced, since it takes minutes."""
    path = probe_path()
    if not path.is_file():
        print(
            f"note: building llama.cpp once with {BUILD_SCRIPT.name} (downloads the llama-cpp-python sdist, then "
            f"compiles it: minutes); the probe goes to {path.parent}",
            file=sys.stderr,
            flush=True,
        )
        if subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL).returncode:
            sys.exit(f"error: {BUILD_SCRIPT} failed (the lines above name its log); run it alone to see why")
    return path


def run_probe(probe: Path, gguf: Path, prompt: list[int], new_tokens: int, threads: int):
    """(new token ids, seconds of the prompt pass, seconds of the new_tokens - 1 steps) from one probe run."""
    done = subprocess.run(
        [str(probe), "generate", str(gguf), str(new_tokens), str(threads)],
        input=" ".join(map(str, prompt)),
        capture_output=True,
        text=True,
        check=True,
    )
    ids_line, seconds_line = done.stdout.splitlines()[:2]
    prefill_s, decode_s = (float(s) for s in seconds_line.split()[1:3])
    return [int(i) for i in ids_line.split()], prefill_s, decode_s


def ids_only_tokenizer_json(tokenizer_json: str) -> str:
    """SmolLM2's vocabulary and merges with only the ByteLevel step of its pre-tokenizer, for the f32 GGUF.

    Our GGUF export declares llama.cpp's 'gpt-2' pre-tokenizer, which has no digit split, so it refuses
    SmolLM2's; the probe is fed token ids, so how text would be split does not matter here.
    """
    spec = json.loads(split_tokenizer_json(tokenizer_json)[0])
    steps = spec["pre_tokenizer"].get("pretokenizers", [spec["pre_tokenizer"]])
    spec["pre_tokenizer"] = next(step for step in steps if step["type"] == "ByteLevel")
    return json.dumps(spec)
