"""Where the llama.cpp programs the tests and benchmarks run are: the ones tools/llamacpp/build.sh builds (cached
under GQA_LLAMACPP_CACHE, ~/.cache/gqa-gpt/llamacpp by default), else for llama.cpp's own tools an install on
PATH (a package manager's llama.cpp ships llama-quantize, llama-bench and llama-simple); the probe is ours and
only build.sh makes it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
# build.sh's --where flag of each program, and the name a llama.cpp install gives it (None: ours only).
PROGRAMS = {
    "probe": ("--where", None),
    "llama-quantize": ("--where-quantize", "llama-quantize"),
    "llama-bench": ("--where-bench", "llama-bench"),
    "llama-simple": ("--where-simple", "llama-simple"),
}


def where_built(flag: str) -> Path:
    """The path build.sh gives for `flag` (built or not)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), flag], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def llamacpp_program(name: str) -> Path | None:
    """The program `name` of PROGRAMS: build.sh's, else the one on PATH; None when neither is there."""
    flag, installed = PROGRAMS[name]
    built = where_built(flag)
    if os.access(built, os.X_OK):
        return built
    found = shutil.which(installed) if installed else None
    return Path(found) if found else None


def not_found(name: str) -> str:
    """What to do when `llamacpp_program(name)` is None."""
    elsewhere = "" if PROGRAMS[name][1] is None else f" put llama.cpp's {name} on PATH,"
    return (
        f"llama.cpp's {name} is not at {where_built(PROGRAMS[name][0])}: run tools/llamacpp/build.sh (minutes, "
        f"once),{elsewhere} or set GQA_LLAMACPP_CACHE to the folder an earlier build.sh built in"
    )
