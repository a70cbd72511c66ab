"""Decode speed: the KV cache against recomputing the context, the compiled step, and batch throughput.

    python -m benchmarks.decode                          # 1024-context model: cached vs recompute vs compiled
    python -m benchmarks.decode --batches 1 8 32         # tokens/s at batch 1, 8 and 32, one cache each

Greedy, prompt 64, 512 new, fp32 on the CPU (or --device); target: a cached path >= 10x recompute. A trained
checkpoint is measured by `python generate.py --checkpoint <ckpt> --benchmark --no_cache`; the GPU's compiled bf16
decode and its MBU by benchmarks.device_check.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import yaml

from benchmarks import ROOT, new_parser, positive_int
from generation.speed import report_decode_speed
from generation.timing import alternate_medians, wall_seconds
from model import GPT, ModelConfig
from model.cache import cache_bytes

SMALL_1024 = ModelConfig(vocab_size=1024, block_size=1024, n_layer=4, n_head=8, n_kv_head=2, n_embd=256)
# The 124 M shape of configs/gpt2-small.yaml, read from it as the tests read it (tests/shapes.py).
_RECIPE = yaml.safe_load((ROOT / "configs" / "gpt2-small.yaml").read_text())
GPT2_SMALL = ModelConfig(vocab_size=_RECIPE["data"]["vocab_size"], block_size=_RECIPE["data"]["block_size"],
                         **{key: _RECIPE["model"][key] for key in ("n_layer", "n_head", "n_kv_head", "n_embd")})  # fmt: skip
DECODE_CONFIGS = {  # the random models of benchmarks.decode_vs_hf
    "small": replace(SMALL_1024, block_size=512),
    "large": replace(GPT2_SMALL, vocab_size=1024, block_size=512),
    "large32k": replace(GPT2_SMALL, vocab_size=32000),
}


def random_model(config: ModelConfig, device: str = "cpu") -> GPT:
    """The benchmarks' random model of `config`: the same weights in every run."""
    torch.manual_seed(0)
    return GPT(config).to(device).eval()


def random_prompt(config: ModelConfig, length: int) -> torch.Tensor:
    """(1, length) random ids, the same in every run."""
    return torch.randint(config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))


def read_bandwidth(device: torch.device) -> float:
    """Bytes/s of the device reading a large tensor once (a sum), median of 5: the bandwidth a decode can use."""
    data = torch.ones((2048 if device.type == "cuda" else 512) * 2**18, device=device)  # MiB of float32
    return data.nbytes / alternate_medians({"read": wall_seconds(lambda: data.sum().item())}, 5)["read"]


def bytes_per_token(model: GPT, context: int) -> int:
    """Bytes one decode step reads: every weight once (a tied embedding once, an untied one a row) plus the
    keys/values in use. Weights kept in GGUF blocks (cpu_kernels.quantized) count as stored."""

    def size(module: torch.nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])

    weights = size(model)
    if not model.config.tie_embeddings:  # each step looks up one row of the embedding
        weights -= size(model.wte) * (model.config.vocab_size - 1) // model.config.vocab_size
    return weights + cache_bytes(model.config, context, next(model.parameters()).element_size())


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--batches", type=positive_int, nargs="+", help="report tokens/s at these batch sizes instead")
    add("--no_compile", action="store_true", help="skip the compiled path (its compile is slow)")
    add("--prompt_len", type=positive_int, default=64, help="prompt tokens (random ids)")
    add("--new_tokens", type=positive_int, default=512, help="tokens decoded per run")
    add("--repeats", type=positive_int, default=3, help="timed rounds after a warm-up; medians")
    add("--device", default="cpu", help="torch device of the model and cache")
    args = parser.parse_args()
    model, c = random_model(SMALL_1024, args.device), SMALL_1024
    print(f"model: {c.n_layer} layers, {c.n_embd} wide, {c.n_head}/{c.n_kv_head} heads, block_size {c.block_size}; "
          f"{torch.get_num_threads()} threads; prompt {args.prompt_len}, {args.new_tokens} new")  # fmt: skip
    speeds = {}
    for batch in args.batches or [1]:  # one cache holds a batch's sequences; tokens/s summed over them
        prompt = torch.randint(0, c.vocab_size, (batch, args.prompt_len), device=args.device)
        speeds[batch] = report_decode_speed(model, prompt, args.new_tokens, compile=not args.no_compile,
                                            with_recompute=not args.batches, repeats=args.repeats)  # fmt: skip
    if args.batches:
        for batch, tps in speeds.items():
            print(f"batch {batch:>3}: " + ", ".join(f"{name} {v:9.1f} tokens/s" for name, v in tps.items()))
        return
    for name, value in speeds[1].items():
        print(f"{name:>9}: {value:9.1f} tokens/s  ({value / speeds[1]['no_cache']:5.1f}x recompute)")
    print("target: a cached path >= 10x recompute (the eager one is the readable reference)")


if __name__ == "__main__":
    main()
