"""Greedy decoding speed: our `generate` against llama.cpp on the same weights exported as an f32 GGUF.

Run from the repository root (needs the `gguf` extra and tools/llamacpp/build.sh, which builds llama.cpp once):

    python -m benchmarks.decode_vs_llamacpp                      # both configs, prompt 64, 256 new tokens
    python -m benchmarks.decode_vs_llamacpp --configs large --repeats 5 --threads 2

Batch 1, fp32 weights and KV cache on both sides, CPU, the same thread count. llama.cpp runs in our small
probe program (tools/llamacpp/probe.cpp), which times the prompt's forward pass and the decode steps itself,
so process start and model loading are left out, as building our model is. The two sides alternate within
each round, so a load spike from other processes hits both alike; the median of `--repeats` rounds after
one warm-up round is reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.llamacpp import build_probe, run_probe
from benchmarks.shapes import DECODE_CONFIGS
from data.tokenizer import Tokenizer
from interop.export_gguf import export_gguf
from model import GPT, ModelConfig, generate

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {name: DECODE_CONFIGS[name] for name in ("small", "large")}  # the same models as decode_vs_hf


def shakespeare_tokenizer(vocab_size: int) -> Tokenizer:
    """A real byte-level BPE, as the GGUF export needs one; the benchmark itself feeds token ids."""
    text = (REPO_ROOT / "data" / "corpora" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:300_000]
    return Tokenizer.train(
        [text[i : i + 2000] for i in range(0, len(text), 2000)], vocab_size, show_progress=False
    )


def bench_config(name: str, config: ModelConfig, probe: Path, args: argparse.Namespace) -> float:
    """Print one config's tokens/s for both sides and return llama.cpp's speed over ours."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    prompt = torch.randint(
        config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(1)
    )
    threads = torch.get_num_threads()
    times: dict[str, list[float]] = {"ours": [], "llama.cpp": []}
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        path = export_gguf(model, shakespeare_tokenizer(config.vocab_size).to_json(), Path(tmp) / "m.gguf")
        for round_index in range(args.repeats + 1):  # round 0 warms both up and is not timed
            start = time.perf_counter()
            ours = generate(model, prompt, args.new_tokens, temperature=0)[0, args.prompt_len :].tolist()
            ours_s = time.perf_counter() - start
            theirs, prefill_s, decode_s = run_probe(probe, path, prompt[0].tolist(), args.new_tokens, threads)
            theirs_s = prefill_s + decode_s
            if round_index:
                times["ours"].append(ours_s)
                times["llama.cpp"].append(theirs_s)
    ours_s, theirs_s = (statistics.median(t) for t in times.values())
    ratio = ours_s / theirs_s
    print(
        f"{name:<6} {config.n_layer:>2}L {config.n_embd:>4}C {config.n_head:>2}H/{config.n_kv_head}kv "
        f"{model.num_params() / 1e6:6.1f}M | ours {args.new_tokens / ours_s:7.1f} tok/s | llama.cpp "
        f"{args.new_tokens / theirs_s:7.1f} tok/s | llama.cpp/ours {ratio:4.2f}x | same tokens: {ours == theirs}"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS), help="random models"
    )
    parser.add_argument("--prompt_len", type=int, default=64, help="prompt tokens (random ids)")
    parser.add_argument("--new_tokens", type=int, default=256, help="tokens decoded per run")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up; medians")
    parser.add_argument("--threads", type=int, default=None, help="threads for both sides (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    probe = build_probe()
    print(
        f"torch {torch.__version__}, llama.cpp from llama-cpp-python 0.3.36 ({probe.name}), "
        f"{torch.get_num_threads()} threads on both sides, batch 1, greedy, f32, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, median of {args.repeats}"
    )
    for name in args.configs:
        bench_config(name, CONFIGS[name], probe, args)


if __name__ == "__main__":
    main()
