"""Time and peak memory of causal attention: fused SDPA vs the explicit matrix vs the flash reference.

    python -m benchmarks.attention                      # B=1, H=8, D=64, MHA, T = 512 .. 4096
    python -m benchmarks.attention --n_kv_head 2        # GQA

fp32 on the CPU, under no_grad, each measurement in a fresh process (no path's freed memory hides another's
allocations). Peak memory is the resident set's growth over one call (`tracemalloc` misses torch's allocations);
time is the median of `--repeats` further calls.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from pathlib import Path

import torch

from benchmarks import in_fresh_process, new_parser
from generation.timing import wall_seconds
from model.attention import explicit_attention, sdpa_attention
from model.flash_reference import flash_attention

PATHS = {  # each takes (q, k, v)
    "sdpa": sdpa_attention,
    "explicit": lambda q, k, v: explicit_attention(q, k, v)[0],  # its probabilities live until it returns
    "flash": lambda q, k, v: flash_attention(q, k, v, block_size_q=128, block_size_k=128),
}
MIB = 2**20


def random_qkv(b: int, h: int, hkv: int, t: int, d: int, device="cpu", dtype=torch.float32) -> tuple:
    g = torch.Generator(device).manual_seed(0)  # q (B, H, T, D), k and v (B, Hkv, T, D)
    return tuple(
        torch.randn(b, heads, t, d, generator=g, dtype=dtype, device=device) for heads in (h, hkv, hkv)
    )


def _status_bytes(field: str) -> int:  # /proc/self/status reports kB
    return int(Path("/proc/self/status").read_text().split(f"\n{field}:")[1].split()[0]) * 1024


def peak_growth(call) -> int:
    """Bytes the resident set grows by at its peak during call(): VmHWM - VmRSS after resetting the high-water
    mark; where it cannot be reset (not Linux), ru_maxrss's growth, blind to a peak below the import-time one."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        call()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024  # kB on Linux
    before = _status_bytes("VmRSS")
    call()
    return _status_bytes("VmHWM") - before


def measure(path: str, t: int, args: argparse.Namespace) -> dict[str, float]:
    fn, heads = PATHS[path], (1, args.n_head, args.n_kv_head)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with torch.no_grad():
        fn(*random_qkv(*heads, 16, args.head_dim))  # one-time library set-up, not billed to the path
        q, k, v = random_qkv(*heads, t, args.head_dim)
        peak = peak_growth(lambda: fn(q, k, v))
        time_s = statistics.median(wall_seconds(lambda: fn(q, k, v))() for _ in range(args.repeats))
    return {"time_s": time_s, "peak_bytes": peak}


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"causal attention, fp32, CPU ({args.threads or torch.get_num_threads()} threads), B=1, H={args.n_head}, "
        f"Hkv={args.n_kv_head}, D={args.head_dim}; time = median of {args.repeats}, memory = peak RSS growth"
    )
    header = ["T", "scores MiB", *(f"{p} ms" for p in PATHS), *(f"{p} MiB" for p in PATHS)]
    header += ["expl/sdpa time", "expl/sdpa mem"]
    print(" | ".join(f"{h:>14}" for h in header))
    for row in rows:
        sdpa, expl = row["sdpa"], row["explicit"]
        cells = [str(row["t"]), f"{row['scores_bytes'] / MIB:.0f}"]
        cells += [f"{row[p]['time_s'] * 1e3:.1f}" if p in row else "-" for p in PATHS]
        cells += [f"{row[p]['peak_bytes'] / MIB:.1f}" if p in row else "-" for p in PATHS]
        ratios = (expl["time_s"] / sdpa["time_s"], expl["peak_bytes"] / max(sdpa["peak_bytes"], 1))
        cells += [f"{ratio:.1f}x" for ratio in ratios]
        print(" | ".join(f"{c:>14}" for c in cells))
    print(
        "scores MiB = size of one fp32 (B, H, T, T) matrix, which the explicit path builds and SDPA never does"
    )


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--seq_lens", type=int, nargs="+", default=[512, 1024, 2048, 4096], help="sequence lengths T")
    add("--n_head", type=int, default=8, help="query heads")
    add("--n_kv_head", type=int, default=8, help="8 is MHA, 2 is GQA, 1 is MQA")
    add("--head_dim", type=int, default=64, help="channels per head")
    add("--repeats", type=int, default=5, help="timed calls per case after a warm-up; median")
    add("--flash_max_t", type=int, default=4096, help="longest T for the slow flash reference")
    add("--threads", type=int, default=0, help="torch threads per case; 0 keeps torch's default")
    args = parser.parse_args()
    rows = []
    for t in args.seq_lens:
        row = {"t": t, "scores_bytes": args.n_head * t * t * 4}
        for path in PATHS:
            if path != "flash" or t <= args.flash_max_t:
                row[path] = in_fresh_process(measure, path, t, args)
        rows.append(row)
        print(f"T={t} done", file=sys.stderr, flush=True)
    print_table(rows, args)


if __name__ == "__main__":
    main()
