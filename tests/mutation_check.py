"""Mutation check, run by hand (not by pytest, not in CI): do tests fail when the property they name breaks?

    python tests/mutation_check.py              # every mutation, after a baseline run of the same tests
    python tests/mutation_check.py --list       # names only
    python tests/mutation_check.py eos-rows-not-padded sigterm-save-skipped   # a few

The repository's working tree is copied once to a temporary folder (without .git, .venv, runs, caches). Each
mutation replaces one exact snippet of one file there, runs `pytest -x -q` on the tests that guard that
property, and restores the file. A mutation whose snippet is gone (the code moved on) prints NOT APPLIED:
update its `old` text, don't drop it. The table at the end says caught / MISSED per mutation; the exit code is
0 only when every mutation was applied and caught.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = (".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".benchmarks", "*.egg-info",
        "wandb", "lightning_logs")  # fmt: skip
GENERATE = "tests/test_generate.py::test_greedy_output_with_cache_equals_no_cache"
PARITY = "tests/model/test_cache_parity.py"
ATTENTION = "tests/model/test_attention.py"
HF_LOGITS = "tests/hf/test_hf_parity.py::test_logits_match_transformers"


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: in `path`, the exact text `old` becomes `new`; `tests` must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    # The five that once passed every test (issue 20), then the ones the low-level tests already caught.
    Mutation(
        "rope-ignores-cache-pos (generate.py)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (GENERATE,),
    ),
    Mutation(
        "rope-ignores-cache-pos (greedy)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (f"{PARITY}::test_greedy_generate_with_cache_equals_recompute",),
    ),
    Mutation(
        "rope-ignores-cache-pos (sampling)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (f"{PARITY}::test_seeded_sampling_with_cache_equals_recompute",),
    ),
    Mutation(
        "eos-rows-not-padded",
        "model/sampling.py",
        "tokens = tokens.masked_fill(before, self.first)",
        "tokens = tokens",
        (f"{PARITY}::test_eos_stops_one_row_mid_sequence_and_pads_it_while_the_other_goes_on",),
    ),
    Mutation(
        "sigterm-save-skipped",
        "checkpoints/save_on_stop.py",
        "if isinstance(exception, SIGTERMException)",
        "if False",
        ("tests/training/test_sigterm.py",),
    ),
    Mutation(
        "induction-on-probe-maps",
        "inspection/attention_stats.py",
        "induction_score(induction_maps,",
        "induction_score(maps,",
        (
            (
                "tests/inspection/test_attention_stats.py::"
                "test_head_statistics_induction_uses_the_models_maps_of_the_repeated_sequence"
            ),
        ),
    ),
    Mutation(
        "maps-path-skips-mlp",
        "model/gpt.py",
        "return x + self.dropout(self.mlp(",
        "return x if probs_out is not None else x + self.dropout(self.mlp(",
        (f"{ATTENTION}::test_attention_maps_are_the_models_own",),
    ),
    Mutation(
        "top-left-causal-mask",
        "model/attention.py",
        "tril(diagonal=s - t)",
        "tril(diagonal=0)",
        (f"{ATTENTION}::test_explicit_path_reproduces_sdpa",),
    ),
    Mutation(
        "is-causal-for-a-chunk",
        "model/attention.py",
        "attn_mask=mask, enable_gqa",
        "is_causal=True, enable_gqa",
        (f"{PARITY}::test_chunked_prefill_matches_full_forward",),
    ),
    Mutation(
        "tiled-gqa-mapping",
        "model/attention.py",
        "k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)",
        "k = k.repeat(1, q.shape[1] // k.shape[1], 1, 1)",
        (f"{ATTENTION}::test_explicit_path_reproduces_sdpa",),
    ),
    Mutation(
        "flash-no-online-rescale",
        "model/flash_reference.py",
        "acc = acc * rescale +",
        "acc = acc +",
        ("tests/model/test_flash_reference.py",),
    ),
    Mutation(
        "flash-tiles-top-left-diagonal",
        "model/flash_reference.py",
        "first_pos = s - t + q_start",
        "first_pos = q_start",
        ("tests/model/test_flash_reference.py",),
    ),
    Mutation(
        "every-rank-reads-shard-0",
        "data/batches.py",
        "self.shard_start = rank * shard_len",
        "self.shard_start = 0",
        ("tests/data/test_data_batches.py",),
    ),
    Mutation(
        "rolled-targets",
        "data/batches.py",
        "x, y = window[..., :-1], window[..., 1:]",
        "x, y = window[..., :-1], window[..., :-1].roll(-1, -1)",
        ("tests/data/test_data_batches.py",),
    ),
    Mutation(
        "stream-restarts-at-batch-0",
        "data/datamodule.py",
        "return trainer.global_step * trainer.accumulate_grad_batches if trainer is not None else 0",
        "return 0",
        ("tests/data/test_data_lightning_resume.py",),
    ),
    Mutation(
        "export-rms-norm-eps-10x-smaller",
        "interop/hf_folder.py",
        '"rms_norm_eps": config.norm_eps,',
        '"rms_norm_eps": config.norm_eps / 10,',
        (HF_LOGITS,),
    ),
    # Chosen for this check: properties the tests name that no entry above exercises.
    Mutation(
        "export-gate-up-swapped",
        "interop/names.py",
        'Part("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", "mlp"),\n'
        '        Part("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", "mlp"),',
        'Part("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_gate.weight", "mlp"),\n'
        '        Part("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_up.weight", "mlp"),',
        (HF_LOGITS,),
    ),
    Mutation(
        "ddp-ranks-read-rank-0-batches",
        "data/datamodule.py",
        "self.train_batches(start_batch, rank, world_size)",
        "self.train_batches(start_batch, 0, world_size)",
        ("tests/training/test_ddp.py",),
    ),
    Mutation(
        "cache-writes-at-position-0",
        "model/cache.py",
        "keys.narrow(2, self.pos, k.shape[2]).copy_(k)",
        "keys.narrow(2, 0, k.shape[2]).copy_(k)",
        (f"{PARITY}::test_token_by_token_decode_matches_full_forward",),
    ),
    Mutation(
        "rope-rotate-half-sign",
        "model/attention.py",
        "torch.cat([-x[..., half:], x[..., :half]]",
        "torch.cat([x[..., half:], -x[..., :half]]",
        (HF_LOGITS,),
    ),
    Mutation(
        "top-p-drops-the-crossing-token",
        "model/sampling.py",
        "drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p",
        "drop_sorted = cumulative >= top_p",
        ("tests/model/test_sampling.py::test_top_p_keeps_the_smallest_set_reaching_p",),
    ),
    Mutation(
        "repetition-penalty-inverted",
        "model/sampling.py",
        "picked / penalty, picked * penalty",
        "picked * penalty, picked / penalty",
        ("tests/model/test_sampling.py::test_repetition_penalty_lowers_seen_tokens_only",),
    ),
    Mutation(
        "nonfinite-loss-unchecked",
        "training/lit_gpt.py",
        "not torch.isfinite(loss).item()",
        "False",
        (
            (
                "tests/training/test_resume.py::"
                "test_nonfinite_loss_raise_stops_and_keeps_the_last_good_checkpoint"
            ),
        ),
    ),
    Mutation(
        "weight-decay-on-norms",
        "training/schedule.py",
        "if p.dim() >= 2]",
        "]",
        ("tests/training/test_optimizer_groups.py",),
    ),
]


def copy_repository(dest: Path) -> Path:
    """The working tree (uncommitted edits included) under dest/repo, without .git, venvs and run outputs."""
    repo = dest / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*SKIP))
    return repo


def run_pytest(repo: Path, tests: list[str], stop_first: bool, timeout: float) -> tuple[int, str]:
    """pytest's exit code and output, run in `repo` so its modules (not the installed ones) are imported."""
    # CI=true: without transformers the HF parity tests fail instead of skipping (a skip would read as MISSED).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1", "CI": "true"}  # fmt: skip
    stop = ["-x"] if stop_first else []
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *stop, *tests]
    try:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout + done.stderr


def first_failure(output: str) -> str:
    """The first failing test and the first line of its error, so the table shows why it failed."""
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    error = re.search(r"^E +(.+)$", output, re.MULTILINE)
    test = found[1].split("/")[-1] if found else "?"
    if not error:
        return test
    return f"{test}: " + "".join(
        c if c.isprintable() else "?" for c in error[1][:70]
    )  # generated text is raw


def check(repo: Path, mutation: Mutation, timeout: float) -> tuple[str, str]:
    """(result, detail): caught, MISSED, NOT APPLIED or ERROR (pytest could not run the tests)."""
    path = repo / mutation.path
    if not path.is_file():
        return "NOT APPLIED", f"{mutation.path} does not exist: update the entry"
    original = path.read_text(encoding="utf-8")
    if (count := original.count(mutation.old)) != 1:
        return "NOT APPLIED", f"old text found {count} times in {mutation.path}, expected once: update it"
    path.write_text(original.replace(mutation.old, mutation.new), encoding="utf-8")
    try:
        code, output = run_pytest(repo, list(mutation.tests), stop_first=True, timeout=timeout)
    finally:
        path.write_text(original, encoding="utf-8")
    if code == 1:
        return "caught", first_failure(output)
    if code == 0:
        return "MISSED", "every test passed with the bug in place"
    return "ERROR", f"pytest exit {code}: " + " | ".join(output.strip().splitlines()[-3:])


def print_table(rows: list[tuple[str, str, str, float]]) -> None:
    width = max(len(name) for name, *_ in rows)
    print(f"\n{'mutation':<{width}}  {'result':<11}  {'s':>5}  detail")
    for name, result, detail, seconds in rows:
        print(f"{name:<{width}}  {result:<11}  {seconds:5.0f}  {detail}")
    caught = sum(result == "caught" for _, result, _, _ in rows)
    print(f"\n{caught} of {len(rows)} mutations caught")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutation names and exit")
    parser.add_argument("--no_baseline", action="store_true", help="skip the unmutated run of their tests")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{m.name}: {m.path}" for m in MUTATIONS))
        return 0
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"error: unknown mutation(s) {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    with tempfile.TemporaryDirectory(prefix="gqa-gpt-mutants-") as scratch:
        repo = copy_repository(Path(scratch))
        if not args.no_baseline:
            tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
            print(f"baseline: {len(tests)} test selections without any mutation ...", flush=True)
            code, output = run_pytest(repo, tests, stop_first=False, timeout=args.timeout * 2)
            if code != 0:
                print(output[-3000:])
                print("error: the tests fail without any mutation; fix that first", file=sys.stderr)
                return 1
        rows = []
        for mutation in chosen:
            start = time.monotonic()
            result, detail = check(repo, mutation, args.timeout)
            rows.append((mutation.name, result, detail, time.monotonic() - start))
            loud = "!!! " if result != "caught" else ""
            print(f"{loud}{mutation.name}: {result} {detail}", flush=True)
    print_table(rows)
    return 0 if all(result == "caught" for _, result, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
