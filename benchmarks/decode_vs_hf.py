"""Greedy decoding speed: our `generate` against transformers' `generate` on the same exported weights.

Run from the repository root (needs the `hf` extra):

    python -m benchmarks.decode_vs_hf                   # both configs, prompt 64, 256 new tokens
    python -m benchmarks.decode_vs_hf --configs small --repeats 5 --threads 1

Batch 1, fp32, CPU, under `torch.inference_mode`. Each model is exported with `export_hf` and loaded back with
`AutoModelForCausalLM.from_pretrained` (SDPA attention, its default dynamic KV cache), so both sides run
identical weights. Each side gets one warm-up run, then the median of `--repeats` timed runs (the two
sides alternate) is reported.
`min_new_tokens` makes transformers produce exactly as many tokens as ours, which never stops early
without an `eos_id`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from common.tokens import EOS_TOKEN
from model import GPT, ModelConfig, generate
from model.export_hf import export_hf

CONFIGS = {
    "small": ModelConfig(vocab_size=1024, block_size=512, n_layer=4, n_head=8, n_kv_head=2, n_embd=256),
    "large": ModelConfig(vocab_size=1024, block_size=512, n_layer=12, n_head=12, n_kv_head=4, n_embd=768),
}
TARGET_RATIO = {"small": 2.0, "large": 1.2}


def minimal_tokenizer_json() -> str:
    """A tokenizer.json that only knows `<|endoftext|>`: the benchmark feeds token ids, never text."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.BPE())
    tokenizer.add_special_tokens([EOS_TOKEN])
    return tokenizer.to_str()


def interleaved_medians(
    runs: dict[str, Callable[[], torch.Tensor]], repeats: int
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Median wall time of each run over `repeats` rounds after one warm-up round, and its last output.

    The runs alternate within each round, so a load spike from other processes hits both sides alike.
    """
    outputs = {name: run() for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, outputs


def bench_config(name: str, config: ModelConfig, prompt_len: int, new_tokens: int, repeats: int) -> float:
    """Print one config's tokens/s for both sides and return ours / transformers."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = GPT(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = export_hf(model, minimal_tokenizer_json(), Path(tmp) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    prompt = torch.randint(config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    eos_id = hf.generation_config.eos_token_id

    def ours() -> torch.Tensor:
        return generate(model, prompt, new_tokens, temperature=0)

    def theirs() -> torch.Tensor:
        return hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=eos_id,
        )

    with torch.inference_mode():
        seconds, outputs = interleaved_medians({"ours": ours, "transformers": theirs}, repeats)
    (ours_s, hf_s), (ours_out, hf_out) = seconds.values(), outputs.values()
    assert ours_out.shape == hf_out.shape == (1, prompt_len + new_tokens)
    ratio = hf_s / ours_s
    params = model.num_params() / 1e6
    print(
        f"{name:<6} {config.n_layer:>2}L {config.n_embd:>4}C {config.n_head:>2}H/{config.n_kv_head}kv "
        f"{params:6.1f}M | ours {new_tokens / ours_s:7.1f} tok/s | transformers {new_tokens / hf_s:7.1f} tok/s "
        f"| ratio {ratio:4.2f}x (target {TARGET_RATIO[name]}x) | same tokens: {torch.equal(ours_out, hf_out)}"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--new_tokens", type=int, default=256)
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
        f"batch 1, greedy, prompt {args.prompt_len}, {args.new_tokens} new tokens, median of {args.repeats}"
    )
    for name in args.configs:
        bench_config(name, CONFIGS[name], args.prompt_len, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main()
