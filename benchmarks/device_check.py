"""Everything a GPU should confirm, in one run of a few minutes: prints a table, exits 1 if a check fails.

    python -m benchmarks.device_check               # one CUDA GPU: the 124 M config of gpt2-small.yaml
    python -m benchmarks.device_check --cpu_smoke   # the same code paths, tiny, on CPU (the tests run it)

Checks, each described in docs/cluster.md: sdpa (each fused backend alone, so a fallback to the math kernel fails),
train (tokens/s, MFU, peak memory, attention kernels, loss), decode (tokens/s, MBU) and resume (bit for bit).
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import ROOT, new_parser
from benchmarks.decode import bytes_per_token, read_bandwidth
from benchmarks.lightning_checks import Row, Settings, check_resume, check_training, passed
from generation.speed import report_decode_speed
from model import GPT
from model.attention import explicit_attention, sdpa_attention

FUSED_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
SDPA_CASE = "forward + backward, GQA, causal"


def settings_for(cpu_smoke: bool) -> Settings:
    """The 124 M model and batch of configs/gpt2-small.yaml; or the same checks small enough for the CPU tests
    (no compile there: tests/training/test_configs.py has it)."""
    if cpu_smoke:
        model = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, learning_rate=3e-3, warmup_steps=2,
                     compile=False)  # fmt: skip
        return Settings("cpu", model, 384, 64, 4, 2, steps=12, timed_from=4, decode_tokens=16,
                        resume_model={"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32})  # fmt: skip
    config = yaml.safe_load((ROOT / "configs" / "gpt2-small.yaml").read_text())
    model, data = {**config["model"], "warmup_steps": 10, "compile": True}, config["data"]
    assert (model["n_layer"], model["n_embd"], model["n_head"], model["n_kv_head"]) == (12, 768, 12, 4)
    return Settings("cuda", model, data["vocab_size"], data["block_size"], data["batch_size"],
                    config["trainer"]["accumulate_grad_batches"], steps=60, timed_from=20, decode_tokens=256,
                    resume_model={"n_layer": 4, "n_head": 8, "n_kv_head": 2, "n_embd": 256})  # fmt: skip


def check_sdpa(device: str, shape: tuple[int, int, int, int, int], attention=sdpa_attention) -> list[Row]:
    """Forward and backward of `attention` at (B, H, Hkv, T, D) in bf16 under each fused backend alone."""
    b, h, hkv, t, d = shape
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (
        torch.randn(b, heads, t, d, generator=g, dtype=torch.bfloat16, device=device)
        for heads in (h, hkv, hkv)
    )
    reference, _ = explicit_attention(q.float(), k.float(), v.float())
    rows = []
    for name, backend in FUSED_BACKENDS.items():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        try:
            with sdpa_kernel([backend]):
                out = attention(*leaves)
                out.float().square().sum().backward()
        except RuntimeError as error:  # "No available kernel": this backend cannot run the shape
            rows.append(Row(f"sdpa {name}", "INFO", "unavailable", str(error).splitlines()[0][:90]))
            continue
        diff = (out.float() - reference).abs().max().item()
        ok = diff < 0.05 and all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
        rows.append(Row(f"sdpa {name}", passed(ok), f"max |diff| {diff:.4f}", f"shape {shape} bf16"))
    fused = ", ".join(row.check[5:] for row in rows if row.status == "PASS")
    return [*rows, Row("sdpa fused for training", passed(bool(fused)), fused or "none", SDPA_CASE)]


def check_decode(settings: Settings, trained: GPT, prompt: torch.Tensor) -> list[Row]:
    """Cached greedy decoding of the trained weights at batch 1 in bf16, eager and compiled: tokens/s (median of 3
    after a warm-up, which compiles) and MBU (weights + cache at the mean context, read at the bandwidth measured)."""
    model = GPT(trained.config)
    model.load_state_dict(trained.state_dict())
    model = model.to(settings.device, torch.bfloat16).eval()
    tokens_per_s = report_decode_speed(model, prompt, settings.decode_tokens, compile=True, repeats=3)
    names = {"cached": "decode tokens/s", "compiled": "decode tokens/s (compile=True)"}
    bandwidth = read_bandwidth(torch.device(settings.device))
    per_token = bytes_per_token(model, prompt.shape[1] + settings.decode_tokens // 2)
    detail = f"prompt {prompt.shape[1]}, {settings.decode_tokens} new, batch 1, bf16, KV cache, prefill not counted"
    mbu = f"{per_token / 1e6:.0f} MB per token, read {bandwidth / 1e9:.0f} GB/s"
    return [Row(names[k], "INFO", f"{v:,.0f}", f"{detail}; MBU {per_token * v / bandwidth:.1%} ({mbu})")
            for k, v in tokens_per_s.items()]  # fmt: skip


def print_table(rows: list[Row]) -> None:
    columns = ("check", "status", "value")
    widths = {column: max(len(getattr(row, column)) for row in rows) for column in columns}
    for row in rows:
        cells = [getattr(row, column).ljust(widths[column]) for column in columns]
        print("  ".join([*cells, row.detail]).rstrip())


def run_checks(settings: Settings, work: Path) -> list[Row]:
    """Every check in order; a check that raises becomes a FAIL row and the run goes on where it can."""
    device = torch.device(settings.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke mode)"
    rows = [Row("device", "INFO", name, f"torch {torch.__version__}")]
    heads, kv_heads, width = (settings.model[key] for key in ("n_head", "n_kv_head", "n_embd"))
    shape = (settings.batch_size, heads, kv_heads, settings.block_size, width // heads)
    rows += _guarded("sdpa", lambda: check_sdpa(settings.device, shape))
    outcome = _guarded("train", lambda: check_training(settings, work))  # (rows, module), or a FAIL row
    train_rows, trained = outcome if isinstance(outcome, tuple) else (outcome, None)
    rows += train_rows
    if trained is not None:
        prompt = torch.as_tensor(trained.trainer.datamodule.val_tokens[:64].astype("int64"))[None].to(device)
        rows += _guarded("decode", lambda: check_decode(settings, trained.model, prompt))
    rows += _guarded("resume", lambda: check_resume(settings, work))
    return rows


def _guarded(section: str, check):
    start = time.perf_counter()
    try:
        result = check()
    except Exception as error:  # a crash is a failed check: report it, keep the other checks' results
        traceback.print_exc()
        return [Row(section, "FAIL", type(error).__name__, (str(error).splitlines() or [""])[0][:100])]
    print(f"[{section}: {time.perf_counter() - start:.0f} s]", file=sys.stderr)
    return result


def main() -> int:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--cpu_smoke", action="store_true", help="tiny model on CPU: the code paths, not the speed")
    add("--steps", type=int, default=None, help="training steps (default 60 on GPU, 12 smoke)")
    add("--min_mfu", type=float, default=0.0, help="FAIL when MFU is below this (e.g. 0.45)")
    args = parser.parse_args()
    settings = replace(settings_for(args.cpu_smoke), min_mfu=args.min_mfu)
    if args.steps:
        settings = replace(settings, steps=args.steps, timed_from=min(settings.timed_from, args.steps // 3))
    if settings.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run with --cpu_smoke to check the code paths on CPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        rows = run_checks(settings, Path(tmp))
    print_table(rows)
    return exit_code(rows)


def exit_code(rows: list[Row]) -> int:
    failed = [row.check for row in rows if row.status == "FAIL"]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
