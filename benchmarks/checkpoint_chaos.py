"""kill -9 at random moments during a run that checkpoints every step; resume each time; compare with a straight run.

    python -m benchmarks.checkpoint_chaos                  # 20 kills (seed 0), then the save stall of a ~100M model
    python -m benchmarks.checkpoint_chaos --kills 5 --stall_rounds 0   # a quick look, no stall measurement

Chaos: a worker (this module with --worker: a small GPT on tiny Shakespeare, a checkpoint every step, every other
segment saving asynchronously, TMPDIR on /dev/shm where available) is SIGKILLed at a random moment after its first
new checkpoint and resumed, M times, then runs to the end; the final weights must equal an uninterrupted run's.
Stall: how long `save_checkpoint` blocks the training thread for a ~100M-parameter GPT with AdamW state.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT, new_parser, non_negative_int, positive_int


def worker_main(args: argparse.Namespace) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from benchmarks.lightning_checks import QUIET_TRAINER
    from checkpoints.run_lock import own_run_dir
    from checkpoints.settings import checkpoint_io, resolve_ckpt_path
    from data.datamodule import TINY_SHAKESPEARE, TextDataModule
    from training import LastCheckpoint, LitGPT

    run_dir = Path(args.run_dir)
    checkpoints = run_dir / "checkpoints"
    own_run_dir(run_dir)  # held until this process ends
    ckpt_path = resolve_ckpt_path(checkpoints, "last" if args.resume else None)
    print(f"resuming from: {ckpt_path}", file=sys.stderr, flush=True)
    trainer = L.Trainer(
        default_root_dir=run_dir, max_steps=args.steps, accelerator="cpu", plugins=[checkpoint_io(2, args.async_save)],
        callbacks=[ModelCheckpoint(dirpath=checkpoints, save_last=True, every_n_train_steps=1, save_top_k=0,
                                   enable_version_counter=False), LastCheckpoint()], **QUIET_TRAINER,
    )  # fmt: skip
    sizes = {"vocab_size": 384, "block_size": 32}
    corpus = args.corpus or str(TINY_SHAKESPEARE)
    data = TextDataModule(
        data_files=corpus, cache_dir=args.cache, batch_size=8, num_workers=args.workers, **sizes
    )
    torch.manual_seed(0)  # the same initial weights in every segment
    shape = {"n_layer": args.n_layer, "n_head": 4, "n_kv_head": 2, "n_embd": args.n_embd}
    module = LitGPT(**sizes, **shape, warmup_steps=2, learning_rate=3e-3)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    torch.save(module.state_dict(), run_dir / "final.pt")


def worker_command(args: argparse.Namespace, run_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.checkpoint_chaos", "--worker", "--run_dir", str(run_dir), "--cache",
            args.cache, "--steps", str(args.steps), "--n_embd", str(args.n_embd), "--n_layer", str(args.n_layer),
            *flags]  # fmt: skip


def chaos(args: argparse.Namespace, work: Path, env: dict) -> None:
    import torch

    from checkpoints.run_dir import step_files
    from common.files import stale_temp_files

    rng = random.Random(args.seed)
    run_dir, checkpoints = work / "chaos", work / "chaos" / "checkpoints"
    outputs, left_by_kill, log = [], [], work / "segment.log"

    def newest_step() -> int:
        return max(step_files(checkpoints), default=-1)

    for kill in range(args.kills):
        flags = ["--resume"] + (["--async"] if kill % 2 else [])
        start_step = newest_step()
        with open(log, "w") as out:
            process = subprocess.Popen(
                worker_command(args, run_dir, *flags), env=env, stdout=out, stderr=out, cwd=ROOT
            )
            # Wait for this segment's first own checkpoint, so every segment makes progress.
            while process.poll() is None and newest_step() <= start_step:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, args.window_s))
            if process.poll() is not None:
                sys.exit(f"segment {kill + 1} finished before its kill: raise --steps ({args.steps})")
            process.send_signal(signal.SIGKILL)
            process.wait()
        outputs.append(log.read_text())
        left_by_kill.append(bool(stale_temp_files(checkpoints)))
    final = subprocess.run(
        worker_command(args, run_dir, "--resume"), env=env, capture_output=True, text=True, cwd=ROOT
    )
    outputs.append(final.stdout + final.stderr)
    straight = work / "straight"
    subprocess.run(worker_command(args, straight), env=env, check=True, capture_output=True, cwd=ROOT)
    same = final.returncode == 0
    if same:
        ours, theirs = torch.load(run_dir / "final.pt"), torch.load(straight / "final.pt")
        same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # Kill k was survived when start k + 1 resumed from a checkpoint, with no fallback warning and no error.
    survived = sum(
        not any(s in text for s in ("resuming from: None", "warning", "Traceback")) for text in outputs[1:]
    )
    left = [p for p in run_dir.rglob("*") if ".partial-" in p.name]
    in_tmpdir = [p for p in Path(env["TMPDIR"]).rglob("*") if p.is_file()]
    left_bytes = sum(p.stat().st_size for p in left + in_tmpdir)
    print(f"kills survived: {survived}/{args.kills} (the next start resumed with no fallback and no error)")
    swept = sum(left and "removed" in text for left, text in zip(left_by_kill, outputs[1:], strict=True))
    print(f"kills that left a temp file: {sum(left_by_kill)}; removed by the next start: {swept}")
    print(f"bytes left behind at the end (temp files in the run dir + anything in TMPDIR): {left_bytes}")
    print(f"final weights equal the uninterrupted run's: {same} ({args.steps} steps, "
          f"n_layer {args.n_layer}, n_embd {args.n_embd})")  # fmt: skip


def stall(args: argparse.Namespace, work: Path) -> None:
    """Median ms the training thread is blocked per save, sync and async rounds interleaved, a step between saves."""
    import torch

    from checkpoints.settings import checkpoint_io
    from model.config import ModelConfig
    from model.gpt import GPT

    torch.manual_seed(0)
    shape = {"n_layer": 12, "n_head": 12, "n_kv_head": 4, "n_embd": args.stall_n_embd}
    model = GPT(ModelConfig(vocab_size=16384, block_size=64, **shape))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 16384, (1, 64))

    def train_step() -> None:
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step()  # creates the AdamW state, as a real checkpoint has it
    print(f"stall model: {model.num_params() / 1e6:.1f}M parameters")
    ios = {"sync": checkpoint_io(2, False), "async": checkpoint_io(2, True)}
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    for round_ in range(args.stall_rounds):
        for mode, io in ios.items():
            for save in range(2):  # the second async save may wait for the first: that wait is stall too
                state = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
                checkpoint = state | {"global_step": round_ * 2 + save}
                start = time.perf_counter()
                io.save_checkpoint(checkpoint, work / f"stall-{mode}" / "last.ckpt")
                stalls[mode].append(time.perf_counter() - start)
                train_step()
            io.teardown()
    size = (work / "stall-sync" / "last.ckpt").stat().st_size
    sync_ms, async_ms = (statistics.median(stalls[m]) * 1e3 for m in ("sync", "async"))
    print(f"save stall per save ({size / 1e6:.0f} MB checkpoint, median of {len(stalls['sync'])}): "
          f"sync {sync_ms:.0f} ms, async {async_ms:.0f} ms; async/sync = {async_ms / sync_ms:.2f}")  # fmt: skip


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--kills", type=non_negative_int, default=20, help="SIGKILLs to survive (M; 0: skip)")
    add("--seed", type=int, default=0, help="seed of the kill moments")
    add("--window_s", type=float, default=1.5, help="a kill lands up to this long after a first save")
    add("--steps", type=positive_int, default=300, help="optimizer steps of the whole run")
    add("--n_embd", type=int, default=192, help="width of the killed runs' model")
    add("--n_layer", type=int, default=4, help="layers of the killed runs' model")
    add("--stall_rounds", type=non_negative_int, default=3, help="sync/async rounds of 2 saves (0: skip)")
    add("--stall_n_embd", type=int, default=768, help="stall model width (a multiple of 12; 768: ~100M)")
    add("--workdir", type=Path, default=None, help="where runs go (default: a new temporary folder)")
    add("--keep", action="store_true", help="keep the work folder")
    # worker mode (internal)
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--run_dir", help=argparse.SUPPRESS)
    add("--cache", help=argparse.SUPPRESS)
    add("--corpus", help=argparse.SUPPRESS)  # the fault tests' small corpus, with --workers loaders
    add("--workers", type=int, default=0, help=argparse.SUPPRESS)
    add("--resume", action="store_true", help=argparse.SUPPRESS)
    add("--async", dest="async_save", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="checkpoint-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    args.cache = str(work / "cache")
    shm = Path("/dev/shm")
    tmpdir = Path(tempfile.mkdtemp(prefix="chaos-tmp-", dir=shm if shm.is_dir() else None))
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(ROOT)}
    try:
        if args.kills:
            chaos(args, work, env)
        if args.stall_rounds:
            stall(args, work)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
