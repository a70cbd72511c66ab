"""Greedy decoding speed: our `generate` against transformers' `generate` on the same exported weights.

Run from the repository root (needs the `hf` extra):

    python -m benchmarks.decode_vs_hf                   # the random configs; prompt 64, 256 new (large32k: 512, 128)
    python -m benchmarks.decode_vs_hf --configs small --repeats 5 --threads 1 --no_compile
    python -m benchmarks.decode_vs_hf --configs smollm2 --repeats 2   # SmolLM2-135M, 64 new (compile: minutes)

Batch 1, fp32, CPU; every side runs the weights `export_hf` wrote. Sides: our eager and compiled `generate`,
transformers' default (dynamic cache) and its static cache + `torch.compile` (not for smollm2: too slow to
compile). smollm2 adds our compiled step on the file's Q4_1 blocks and, when built, llama.cpp's probe on the
shipped file and on our f32 export. Each side also runs with one new token, its prefill: decode tok/s is
(new - 1) / (time - prefill). MBU = bytes a step reads x decode tok/s / the best read bandwidth of the rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import new_parser
from benchmarks.decode import DECODE_CONFIGS, bytes_per_token, random_model, random_prompt, read_bandwidth
from benchmarks.external import built_probe, run_probe, smollm2_models
from common.errors import run_command
from common.tokens import EOS_TOKEN
from data.tokenizer import Tokenizer
from generation.timing import alternate_medians, wall_seconds
from interop.export_hf import export_hf
from model import GPT, generate

# ours (best path) / transformers default
TARGET_RATIO = {"small": 3.0, "large": 1.2, "large32k": 1.5, "smollm2": 1.5}
# prompt, new tokens: large32k a realistic vocabulary with a long prompt; smollm2 a real model, kept short
LENGTHS = {"large32k": (512, 128), "smollm2": (64, 64)}


def minimal_tokenizer() -> Tokenizer:
    """A tokenizer that only knows `<|endoftext|>`: the benchmark feeds token ids, never text."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import models

    backend = BackendTokenizer(models.BPE())
    backend.add_special_tokens([EOS_TOKEN])
    return Tokenizer.from_json(backend.to_str())


def hf_twin(model: GPT, tokenizer: Tokenizer):
    """transformers' model of our weights: exported with `export_hf`, loaded back (SDPA attention)."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        path = export_hf(model, tokenizer, Path(tmp) / "hf")
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()


def probe_runs(side: str, probe: Path, gguf: Path) -> bool:
    """Whether the probe decodes from `gguf` at all; a failure is printed in one line and the side left out."""
    try:
        run_probe(probe, gguf, list(range(100, 164)), 2, torch.get_num_threads())
    except subprocess.CalledProcessError as error:
        print(f"  {side}: left out, the probe failed on {gguf.name} (exit {error.returncode})")
        return False
    return True


def bench_config(
    name: str, model: GPT, hf, args: argparse.Namespace, llamacpp: dict, probe=None, blocks: GPT | None = None
) -> bool:
    """Print one model's tokens/s and MBU for each side and the ratios against transformers' default; return
    whether ours and transformers made the same tokens. `llamacpp` maps a side's name to the GGUF the probe
    runs; `blocks`, the same model with its GGUF matrices kept in their blocks, adds a compiled side."""
    from transformers.generation import CompileConfig

    prompt_len, new_tokens = LENGTHS.get(name, (64, 256))
    prompt_len, new_tokens = args.prompt_len or prompt_len, args.new_tokens or new_tokens
    prompt = random_prompt(model.config, prompt_len)
    # transformers compiles its static-cache decode step only on accelerators unless told to compile everywhere.
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True
    static = {"cache_implementation": "static", "compile_config": compile_config}

    def theirs(n: int, **extra):  # the pad token is export_hf's, in the generation config
        mask = torch.ones_like(prompt)
        return lambda: hf.generate(
            prompt, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, **extra
        )

    def sides(n: int) -> dict:
        runs = {"ours": lambda: generate(model, prompt, n, temperature=0), "transformers": theirs(n)}
        if not args.no_compile:
            runs["ours compiled"] = lambda: generate(model, prompt, n, temperature=0, compile=True)
            if blocks is not None:
                runs["ours Q4_1 compiled"] = lambda: generate(blocks, prompt, n, temperature=0, compile=True)
            if name != "smollm2":
                runs["hf static+compile"] = theirs(n, **static)
        return runs

    # Each side also runs with one new token: its prefill alone. Decoding speed is then the other tokens over the
    # difference, the same way on every side.
    outputs: dict = {}
    runs = {
        (side, n): wall_seconds(run, outputs, (side, n))
        for n in (new_tokens, 1)
        for side, run in sides(n).items()
    }

    threads = torch.get_num_threads()

    def probe_run(side: str, n: int):
        def run() -> float:  # the seconds the probe reports for its prompt pass and n - 1 steps
            ids, prefill_s, decode_s = run_probe(probe, llamacpp[side], prompt[0].tolist(), n, threads)
            outputs[(side, n)] = torch.cat([prompt, torch.tensor([ids])], dim=1)
            return prefill_s + decode_s

        return run

    runs |= {(side, n): probe_run(side, n) for side in llamacpp for n in (new_tokens, 1)}
    # The read bandwidth is measured in every round, between the decoding runs, and the best round counts: a
    # reading swings by 2x on a shared machine, and a dip would flatter the MBU.
    readings: list[float] = []

    def read_round() -> float:
        readings.append(read_bandwidth(torch.device("cpu")))
        return readings[-1]

    runs["read"] = read_round
    with torch.inference_mode():
        seconds = alternate_medians(runs, args.repeats)
    names, bandwidth = [*sides(1), *llamacpp], max(readings)
    same = {side: torch.equal(outputs[(side, new_tokens)], outputs[("ours", new_tokens)]) for side in names}
    context = prompt_len + new_tokens // 2
    per_token = {side: bytes_per_token(model, context) for side in names}
    if blocks is not None:
        per_token["ours Q4_1 compiled"] = bytes_per_token(blocks, context)
    for side, gguf in llamacpp.items():  # llama.cpp reads each weight as its file stores it (Q4_1: 1/6)
        per_token[side] += gguf.stat().st_size - bytes_per_token(model, 0)
    c = model.config
    print(
        f"{name}: {c.n_layer}L {c.n_embd}C {c.n_head}H/{c.n_kv_head}kv V={c.vocab_size} "
        f"{model.num_params() / 1e6:.1f}M, prompt {prompt_len}, {new_tokens} new, {per_token['ours'] / 1e6:.0f} MB read "
        f"per token, read bandwidth {bandwidth / 1e9:.1f} GB/s, load average {os.getloadavg()[0]:.1f}"
    )
    total = {side: seconds[(side, new_tokens)] for side in names}
    decode = {side: (new_tokens - 1) / (total[side] - seconds[(side, 1)]) for side in names}
    for side in names:
        print(
            f"  {side:<18} {new_tokens / total[side]:8.2f} tok/s {total['transformers'] / total[side]:5.2f}x "
            f"transformers | prefill {1000 * seconds[(side, 1)]:7.1f} ms | decode {decode[side]:7.2f} tok/s "
            f"{decode[side] / decode['transformers']:5.2f}x, MBU {per_token[side] * decode[side] / bandwidth:6.1%} | "
            f"same tokens as ours: {same[side]}"
        )  # the first tok/s counts the prefill too, alike on every side
    best = max((side for side in total if side.startswith("ours")), key=lambda side: decode[side])
    print(f"  target: ours >= {TARGET_RATIO[name]}x transformers; got {total['transformers'] / total[best]:.2f}x "
          f"end to end, {decode[best] / decode['transformers']:.2f}x decoding ({best})")  # fmt: skip
    return all(same[side] for side in sides(1))


def run_config(name: str, args: argparse.Namespace) -> bool:
    """Build one config's models (and llama.cpp's files for smollm2), run it; whether the tokens agreed."""
    if name != "smollm2":
        model = random_model(DECODE_CONFIGS[name])
        return bench_config(name, model, hf_twin(model, minimal_tokenizer()), args, {})
    probe = built_probe()
    if probe is None:
        print("  llama.cpp: skipped, its probe is not built (tools/llamacpp/build.sh builds it, minutes)")
    with tempfile.TemporaryDirectory() as tmp:
        loaded, blocks, f32, shipped = smollm2_models(Path(tmp))
        files = {"llama.cpp Q4_1": shipped, "llama.cpp f32": f32} if probe else {}
        llamacpp = {side: gguf for side, gguf in files.items() if probe_runs(side, probe, gguf)}
        hf = hf_twin(loaded.model, loaded.tokenizer)
        return bench_config(
            name, loaded.model, hf, args, llamacpp, probe, None if args.no_compile else blocks
        )


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    configs = [*sorted(DECODE_CONFIGS), "smollm2"]
    add(
        "--configs", nargs="+", choices=configs, default=list(DECODE_CONFIGS), help="models (default: random)"
    )
    add("--prompt_len", type=int, default=None, help="default 64 (large32k: 512)")
    add("--new_tokens", type=int, default=None, help="default 256 (large32k: 128, smollm2: 64)")
    add("--no_compile", action="store_true", help="skip both compiled sides (CPU compiles are slow)")
    add("--repeats", type=int, default=3, help="timed rounds after a warm-up; medians")
    # 1 thread by default: on shared cores a one-token step's parallel region waits for a descheduled worker,
    # which measures the load, not the code. Give the core count on an idle machine.
    add("--threads", type=int, default=1, help="torch intra-op threads, and llama.cpp's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Local folders only: never let from_pretrained reach for the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
        f"batch 1, greedy, median of {args.repeats}; MBU = (weights + cache at the mean context) bytes per token "
        "x decode tok/s / the best read bandwidth of the rounds (a torch.sum over 512 MiB, median of 5, each round)"
    )
    agreed = [run_config(name, args) for name in args.configs]
    if not all(agreed):
        raise SystemExit("error: ours and transformers made different tokens (see 'same tokens' above)")


if __name__ == "__main__":
    sys.exit(run_command(main))
