"""Greedy decoding speed: our `generate` against transformers' `generate` on the same exported weights.

Run from the repository root (needs the `hf` extra):

    python -m benchmarks.decode_vs_hf                   # every config; prompt 64, 256 new (large32k: 512, 128)
    python -m benchmarks.decode_vs_hf --configs small --repeats 5 --threads 1 --no_compile

Batch 1, fp32, CPU, under `torch.inference_mode`. Each model is exported with `export_hf` and loaded back with
`AutoModelForCausalLM.from_pretrained` (SDPA attention), so every side runs identical weights. Four sides: our
eager `generate`, ours with `compile=True` (the static-shape step), transformers' default `generate` (dynamic
cache) and transformers with its static cache + `torch.compile` (fullgraph). Each side gets one warm-up run
(which compiles), then the median of `--repeats` timed runs (the sides alternate: benchmarks/timing.py). Every side also
runs with one new token, its prefill alone; decode tok/s is (new tokens - 1) / (time - prefill time). MBU is the
bytes a step must read (every weight once, plus the KV cache at the mean context length) x decode tok/s, over the
best read bandwidth over the rounds, each round measuring it (`benchmarks.decode.read_bandwidth`) between the
decoding runs (a conservative MBU: a slow reading would flatter it).
`min_new_tokens` makes transformers produce exactly as many tokens as ours, which never stops early
without an `eos_id`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.decode import bytes_per_token, read_bandwidth
from benchmarks.timing import alternate_medians, wall_seconds
from common.tokens import EOS_TOKEN
from model import GPT, ModelConfig, generate
from model.export_hf import export_hf

CONFIGS = {
    "small": ModelConfig(vocab_size=1024, block_size=512, n_layer=4, n_head=8, n_kv_head=2, n_embd=256),
    "large": ModelConfig(vocab_size=1024, block_size=512, n_layer=12, n_head=12, n_kv_head=4, n_embd=768),
    "large32k": ModelConfig(
        vocab_size=32000, block_size=1024, n_layer=12, n_head=12, n_kv_head=4, n_embd=768
    ),
}
TARGET_RATIO = {"small": 3.0, "large": 1.2, "large32k": 1.5}  # ours (best path) / transformers default
LENGTHS = {"large32k": (512, 128)}  # prompt, new tokens: a realistic vocabulary with a long prompt


def minimal_tokenizer_json() -> str:
    """A tokenizer.json that only knows `<|endoftext|>`: the benchmark feeds token ids, never text."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.BPE())
    tokenizer.add_special_tokens([EOS_TOKEN])
    return tokenizer.to_str()


def bench_config(
    name: str, config: ModelConfig, prompt_len: int, new_tokens: int, repeats: int, compile: bool
) -> None:
    """Print one config's tokens/s and MBU for each side, and the ratios against transformers' default."""
    from transformers import AutoModelForCausalLM
    from transformers.generation import CompileConfig

    torch.manual_seed(0)
    model = GPT(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = export_hf(model, minimal_tokenizer_json(), Path(tmp) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    prompt = torch.randint(config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    eos_id = hf.generation_config.eos_token_id
    # transformers compiles its static-cache decode step only on accelerators unless told to compile everywhere.
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True

    def theirs(n: int, **extra) -> Callable[[], torch.Tensor]:
        return lambda: hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
            max_new_tokens=n, min_new_tokens=n, pad_token_id=eos_id, **extra,
        )  # fmt: skip

    def sides(n: int) -> dict[str, Callable[[], torch.Tensor]]:
        runs = {"ours": lambda: generate(model, prompt, n, temperature=0), "transformers": theirs(n)}
        if compile:
            runs["ours compiled"] = lambda: generate(model, prompt, n, temperature=0, compile=True)
            runs["hf static+compile"] = theirs(
                n, cache_implementation="static", compile_config=compile_config
            )
        return runs

    # Each side also runs with one new token: its prefill alone. Decoding speed is then the other tokens over the
    # difference, the same way on every side.
    outputs: dict = {}
    runs = {
        (side, n): wall_seconds(run, outputs, (side, n))
        for n in (new_tokens, 1)
        for side, run in sides(n).items()
    }
    # The read bandwidth is measured in every round, between the decoding runs, and the best round counts: a
    # reading swings by 2x on a shared machine, and a dip would flatter the MBU.
    readings: list[float] = []

    def read_round() -> float:
        readings.append(read_bandwidth(torch.device("cpu")))
        return readings[-1]

    runs["read"] = read_round
    with torch.inference_mode():
        seconds = alternate_medians(runs, repeats)
    bandwidth = max(readings)
    per_token = bytes_per_token(model, prompt_len + new_tokens // 2)
    same = all(torch.equal(outputs[(side, new_tokens)], outputs[("ours", new_tokens)]) for side in sides(1))
    print(
        f"{name}: {config.n_layer}L {config.n_embd}C {config.n_head}H/{config.n_kv_head}kv V={config.vocab_size} "
        f"{model.num_params() / 1e6:.1f}M, prompt {prompt_len}, {new_tokens} new, {per_token / 1e6:.0f} MB read "
        f"per token, read bandwidth {bandwidth / 1e9:.1f} GB/s, same tokens on every side: {same}"
    )
    total = {side: seconds[(side, new_tokens)] for side in sides(1)}
    decode = {side: (new_tokens - 1) / (total[side] - seconds[(side, 1)]) for side in sides(1)}
    for side in sides(1):
        tps = new_tokens / total[side]  # prefill included, alike on every side
        print(
            f"  {side:<18} {tps:8.1f} tok/s {total['transformers'] / total[side]:5.2f}x transformers | prefill "
            f"{1000 * seconds[(side, 1)]:7.1f} ms | decode {decode[side]:7.1f} tok/s "
            f"{decode[side] / decode['transformers']:5.2f}x, MBU {per_token * decode[side] / bandwidth:6.1%}"
        )
    best = max((side for side in total if side.startswith("ours")), key=lambda side: decode[side])
    print(f"  target: ours >= {TARGET_RATIO[name]}x transformers; got {total['transformers'] / total[best]:.2f}x "
          f"end to end, {decode[best] / decode['transformers']:.2f}x decoding ({best})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--prompt_len", type=int, default=64, help="(large32k: 512)")
    parser.add_argument("--new_tokens", type=int, default=256, help="(large32k: 128)")
    parser.add_argument(
        "--no_compile", action="store_true", help="skip both compiled sides (CPU compiles are slow)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        # On a busy machine, OpenMP regions wait for a descheduled worker; one thread measures the code.
        torch.set_num_threads(args.threads)
    # Local folders only: never let from_pretrained reach for the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
        f"batch 1, greedy, median of {args.repeats}; MBU = (weights + cache at the mean context) bytes per token "
        "x decode tok/s / the best read bandwidth of the rounds (a torch.sum over 512 MiB, median of 5, each round)"
    )
    for name in args.configs:
        prompt_len, new_tokens = LENGTHS.get(name, (args.prompt_len, args.new_tokens))
        bench_config(name, CONFIGS[name], prompt_len, new_tokens, args.repeats, not args.no_compile)


if __name__ == "__main__":
    main()
