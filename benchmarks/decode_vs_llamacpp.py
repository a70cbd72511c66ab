"""Greedy decoding speed: our `generate` against llama.cpp on the same weights, decode and prefill apart.

Run from the repository root (needs the `gguf` extra and tools/llamacpp/build.sh, which builds llama.cpp once):

    python -m benchmarks.decode_vs_llamacpp                      # both configs, prompt 64, 256 new tokens, pp512
    python -m benchmarks.decode_vs_llamacpp --configs large --repeats 5 --threads 2
    python -m benchmarks.decode_vs_llamacpp --configs smollm2 --threads 2 --compile   # its f32 and Q4_1 files

A random config runs from our f32 GGUF export; SmolLM2-135M twice, as float32 against our f32 export of it and
with its Q4_1 blocks kept against the shipped file. Batch 1, fp32 activations and KV cache, one thread count.
As llama-bench's tg and pp tests do, decode (after --prompt_len) and a --prefill_len prefill are timed apart,
each side in its own loop (llama.cpp in tools/llamacpp/probe.cpp), alternating within every round (medians).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import new_parser
from benchmarks.decode import DECODE_CONFIGS, bytes_per_token, random_model, random_prompt
from benchmarks.external import built_probe, run_probe, smollm2_models
from common.errors import run_command
from data.datamodule import TINY_SHAKESPEARE
from data.tokenizer import Tokenizer
from generation.speed import timed_decode
from generation.timing import alternate_medians
from interop.export_gguf import export_gguf
from model import GPT, generate
from model.static_decode import static_decoder

CONFIGS = {name: DECODE_CONFIGS[name] for name in ("small", "large")}  # the same models as decode_vs_hf


def pairs(name: str, folder: Path) -> list[tuple[str, GPT, Path]]:
    """(label, our model, llama.cpp's GGUF of the same weights) for one config; files go into `folder`."""
    if name == "smollm2":
        loaded, blocks, f32, shipped = smollm2_models(folder)
        # Our step on the file's own Q4_1 blocks against llama.cpp on that file: the same bytes on both sides.
        return [("smollm2 f32", loaded.model, f32), ("smollm2 Q4_1", blocks, shipped)]
    model = random_model(CONFIGS[name])
    # A real byte-level BPE, as the GGUF export needs one; the benchmark itself feeds token ids.
    text = TINY_SHAKESPEARE.read_text(encoding="utf-8")[:300_000]
    docs = [text[i : i + 2000] for i in range(0, len(text), 2000)]
    tokenizer = Tokenizer.train(docs, model.config.vocab_size, show_progress=False)
    return [(name, model, export_gguf(model, tokenizer, folder / f"{name}.gguf"))]


def bench_pair(label: str, model: GPT, gguf: Path, probe: Path, args: argparse.Namespace) -> None:
    """Print one model's decode and prefill tokens/s on both sides, their ratios, and whether the tokens agree."""
    config, threads = model.config, torch.get_num_threads()
    prompt, long = random_prompt(config, args.prompt_len), random_prompt(config, args.prefill_len)

    def theirs(tokens: torch.Tensor, n: int):
        def run() -> tuple[float, float]:  # (prefill seconds, decode tokens/s), as timed_decode returns
            _, prefill_s, decode_s = run_probe(probe, gguf, tokens[0].tolist(), n, threads)
            return prefill_s, (n - 1) / decode_s if decode_s else float("inf")

        return run

    # Our eager step (the default path) always, the compiled one too with --compile; prefill is eager on both.
    ours = {"ours": False, "ours compiled": True} if args.compile else {"ours": False}
    runs = {
        f"{side} decode": lambda c=c: timed_decode(model, prompt, args.new_tokens, compile=c)
        for side, c in ours.items()
    }
    runs |= {
        "llama.cpp decode": theirs(prompt, args.new_tokens),
        "ours prefill": lambda: timed_decode(model, long, 1),
        "llama.cpp prefill": theirs(long, 1),
    }
    with torch.inference_mode():
        if args.compile:  # the compiled step is built before the timed rounds, not inside the first
            static_decoder(model, 1, length=args.prompt_len + args.new_tokens).warm_up()
        medians = alternate_medians(runs, args.repeats)
        ours_ids = [
            generate(model, prompt, args.new_tokens, temperature=0, compile=c)[0, args.prompt_len :].tolist()
            for c in ours.values()
        ]
    theirs_ids = run_probe(probe, gguf, prompt[0].tolist(), args.new_tokens, threads)[0]
    llama = medians["llama.cpp decode"][1]
    decode = " ".join(
        f"{side} {medians[f'{side} decode'][1]:7.1f} tok/s ({medians[f'{side} decode'][1] / llama:4.2f}x),"
        for side in ours
    )
    prefill = {side: args.prefill_len / medians[f"{side} prefill"][0] for side in ("ours", "llama.cpp")}
    print(
        f"{label} ({config.n_layer}L {config.n_embd}C {config.n_head}H/{config.n_kv_head}kv "
        f"{bytes_per_token(model, 0) / 1e6:.0f} MB of weights) | threads: ours {threads}, llama.cpp {threads} | decode: "
        f"{decode} llama.cpp {llama:7.1f} | pp{args.prefill_len}: ours {prefill['ours']:7.0f} tok/s, "
        f"llama.cpp {prefill['llama.cpp']:7.0f}, ours/llama.cpp {prefill['ours'] / prefill['llama.cpp']:4.2f}x | "
        f"same tokens: {all(ids == theirs_ids for ids in ours_ids)}"
    )


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    configs = [*sorted(CONFIGS), "smollm2"]
    add("--configs", nargs="+", choices=configs, default=list(CONFIGS), help="models (default: random)")
    add("--compile", action="store_true", help="our compiled step too (CPU compiles: tens of seconds)")
    add("--prompt_len", type=int, default=64, help="prompt tokens before the decode (random ids)")
    add("--new_tokens", type=int, default=256, help="tokens decoded per run")
    add("--prefill_len", type=int, default=512, help="prompt tokens of the prefill test (pp512)")
    add("--repeats", type=int, default=3, help="timed rounds after a warm-up; medians")
    add("--threads", type=int, default=None, help="threads for both sides (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    probe = built_probe(build=True)
    print(f"torch {torch.__version__}, llama.cpp from llama-cpp-python 0.3.36 ({probe.name}), batch 1, greedy, "
          f"f32; decode: prompt {args.prompt_len}, {args.new_tokens} new tokens; prefill: {args.prefill_len} "
          f"tokens; medians of {args.repeats}")  # fmt: skip
    for name in args.configs:
        with tempfile.TemporaryDirectory() as tmp:
            for label, model, gguf in pairs(name, Path(tmp)):
                bench_pair(label, model, gguf, probe, args)


if __name__ == "__main__":
    sys.exit(run_command(main))
