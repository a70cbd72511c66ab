"""Mutation check, run by hand (not by pytest, not in CI): do tests fail when the property they name breaks?

    python tests/mutation_check.py              # every mutation, after a baseline run of the same tests
    python tests/mutation_check.py --list       # names only
    python tests/mutation_check.py eos-rows-not-padded sigterm-save-skipped   # a few

The repository's working tree is copied once to a temporary folder (without .git, .venv, runs, caches). Each
mutation replaces one exact snippet of one file there, runs `pytest -x -q` on the tests that guard that
property, and restores the file. A mutation whose snippet is gone (the code moved on) prints NOT APPLIED:
update its `old` text in tests/mutations.py, don't drop it. The table at the end says caught / MISSED per
mutation; the exit code is 0 only when every mutation was applied and caught.
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
from pathlib import Path

from mutations import MUTATIONS, Mutation  # tests/mutations.py (run as a script: tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
SKIP = (".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache", ".benchmarks", "*.egg-info",
        "wandb", "lightning_logs")  # fmt: skip


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
