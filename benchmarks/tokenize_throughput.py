"""Tokenization throughput on a generated corpus: the prepare command against raw `tokenizers`, and streaming.

    python -m benchmarks.tokenize_throughput [--size_mb 1000] [--repeats 1] [--vocab_size 32768] [--part a|b|both]

(a) At num_proc 1 and 2, interleaved: raw `encode_batch_fast` (what our tokenizer calls) on the documents in
memory in as many processes (the limit), against `python -m data.prepare` from an empty cache. (b) A streaming
`train.py fit`: launch to step 1, the step time, and the loader's tokens/s against what training consumes. The
corpus and the figures: docs/data.md. (Not named tokenize.py: it would shadow the standard library's module.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import operator
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import numpy as np

from benchmarks import QUIET, ROOT, in_fresh_process, new_parser

SHARD_MB = 128
BASE_WORDS = 4_000_000  # ~22 MB of text that documents are cut from
BATCH_DOCS = 512  # documents per encode call, as data/tokenize_parts.py reads them
CLOCK = "step-clock"
FIT_STEPS = 3
_shared: dict = {}  # what the forked raw-baseline processes inherit


def write_corpus(folder: Path, size_mb: float) -> list[Path]:
    """An even count of JSON-lines shards (two streaming readers get whole files) of about size_mb MB in all:
    slices of one long text of random words in their Shakespeare frequencies (1 GB takes seconds)."""
    from data.datamodule import TINY_SHAKESPEARE  # imported once the fresh HF caches are set (main)

    words = TINY_SHAKESPEARE.read_text(encoding="utf-8").split()
    pool = words + ["\n\n"] * (len(words) // 60)  # paragraph breaks
    rng = np.random.default_rng(0)
    base = " ".join(operator.itemgetter(*rng.integers(0, len(pool), size=BASE_WORDS))(pool))
    count = max(2, 2 * round(size_mb / SHARD_MB / 2))
    files = [folder / f"shard-{index:04d}.jsonl" for index in range(count)]
    for file in files:
        written, target = 0, size_mb * 1e6 / count
        with file.open("w", encoding="utf-8") as out:
            while written < target:
                lengths = np.clip(rng.lognormal(7.6, 1.1, size=256), 20, 200_000).astype(int)
                starts = rng.integers(0, len(base) - lengths.max(), size=len(lengths))
                docs = [base[s : s + n].strip() for s, n in zip(starts, lengths, strict=True)]
                out.write("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
                written += sum(map(len, docs))
    return files


def read_documents(files: list[str]) -> list[str]:
    return [json.loads(line)["text"] for file in files for line in open(file, encoding="utf-8")]


def _encode_share(bounds: tuple[int, int]) -> None:
    docs, encode = _shared["docs"], _shared["backend"].encode_batch_fast
    for start in range(bounds[0], bounds[1], BATCH_DOCS):
        encode(docs[start : min(bounds[1], start + BATCH_DOCS)], add_special_tokens=False)


def raw_rate(procs: int, tokenizer_file: str, files: list[str]) -> tuple[float, float]:
    """The limit: (MB/s, MB of text) of raw encode_batch_fast of every document in `procs` processes."""
    from tokenizers import Tokenizer as Backend

    docs = read_documents(files)
    sizes = np.cumsum([len(doc.encode("utf-8")) for doc in docs])
    # Contiguous shares of equal text, like the parts of the prepare command.
    cuts = [0, *(int(np.searchsorted(sizes, sizes[-1] * k / procs)) for k in range(1, procs)), len(docs)]
    _shared.update(docs=docs, backend=Backend.from_file(tokenizer_file))
    start = time.perf_counter()
    if procs == 1:
        _encode_share((0, len(docs)))
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process, as the prepare command runs
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            pool.map(_encode_share, list(zip(cuts[:-1], cuts[1:], strict=True)))
    return sizes[-1] / 1e6 / (time.perf_counter() - start), sizes[-1] / 1e6


def data_flags(files: list[str], tokenizer: Path, cache: Path, vocab_size: int) -> list[str]:
    return ["--data.dataset", "json", "--data.data_files", json.dumps(files), "--data.tokenizer_path",
            str(tokenizer), "--data.vocab_size", str(vocab_size), "--data.cache_dir", str(cache)]  # fmt: skip


def run_prepare(procs: int, flags: list[str], megabytes: float) -> tuple[float, float]:
    """(MB/s of the tokenization phase from its last progress line, MB/s of the whole command)."""
    start = time.perf_counter()
    args = [sys.executable, "-m", "data.prepare", *flags, "--data.num_proc", str(procs)]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"data.prepare failed:\n{out.stderr[-3000:]}")
    rates = re.findall(r"([0-9.]+) MB/s", out.stderr)
    return float(rates[-1]), megabytes / seconds


def measure_prepare(files: list[str], tokenizer: Path, folder: Path, args: argparse.Namespace) -> None:
    from data.source import CorpusSource

    start = time.perf_counter()
    CorpusSource(dataset="json", data_files=files).load()
    seconds = time.perf_counter() - start
    print(f"JSON -> Arrow conversion by datasets, once (not in the figures below): {seconds:.1f} s")
    rows: dict[int, list[tuple[float, float, float]]] = {1: []} if args.smoke else {1: [], 2: []}
    for round_index in range(args.repeats):
        for procs in rows:
            # In a fresh process of its own, so no tokenizer thread pool is inherited.
            raw, megabytes = in_fresh_process(raw_rate, procs, str(tokenizer), files)
            cache = folder / f"cache-{round_index}-{procs}"
            phase, whole = run_prepare(procs, data_flags(files, tokenizer, cache, args.vocab_size), megabytes)
            rows[procs].append((raw, phase, whole))
            print(f"  round {round_index + 1}, {procs} proc: raw {raw:.2f}, ours {phase:.2f} (command {whole:.2f}) "
                  "MB/s")  # fmt: skip
    for procs, measured in rows.items():
        raw, phase, whole = (statistics.median(column) for column in zip(*measured, strict=True))
        print(f"(a) num_proc {procs}: raw encode_batch_fast {raw:5.2f} MB/s | prepare tokenization {phase:5.2f} MB/s "
              f"= {100 * phase / raw:3.0f}% of the limit | whole prepare command {whole:5.2f} MB/s = {100 * whole / raw:3.0f}%")  # fmt: skip


class StepClock(L.Callback):
    """Prints the wall-clock time when the first batch is in hand and at the end of every step (rank 0)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.is_global_zero and trainer.global_step == 0:
            print(f"{CLOCK} 0 {time.time():.3f}", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero:
            print(f"{CLOCK} {trainer.global_step} {time.time():.3f}", flush=True)


def run_fit(flags: list[str], run_dir: Path) -> tuple[float, float, float]:
    """Seconds from launch to step 1's batch in hand and to its end, and the median step time after it."""
    settings = {"model.n_embd": 192, "model.compile": "false", "data.batch_size": 4, "data.num_workers": 2,
                "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.strategy": "auto",
                "trainer.precision": "32-true", "trainer.accumulate_grad_batches": 1, "trainer.max_steps": FIT_STEPS,
                "trainer.default_root_dir": run_dir, "checkpoint.every_n_train_steps": 100000}  # fmt: skip
    clock = json.dumps({"class_path": "benchmarks.tokenize_throughput.StepClock"})
    args = [sys.executable, "train.py", "fit", "--config", "configs/gpt2-small.yaml", *QUIET, *flags,
            *(str(part) for key, value in settings.items() for part in (f"--{key}", value)),
            f"--trainer.callbacks+={clock}"]  # fmt: skip
    launched = time.time()
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"train.py fit failed:\n{out.stderr[-3000:]}")
    clocks = [float(line.split()[2]) for line in out.stdout.splitlines() if line.startswith(CLOCK)]
    steps = [later - earlier for earlier, later in itertools.pairwise(clocks[1:])]
    return clocks[0] - launched, clocks[1] - launched, statistics.median(steps)


def loader_tokens_per_s(seconds: float, **data_settings) -> float:
    """Tokens/s the streaming DataLoader alone delivers at num_workers 2 (after its first batch)."""
    from data.datamodule import TextDataModule

    data = TextDataModule(dataset="json", streaming=True, batch_size=4, num_workers=2, **data_settings)
    data.setup()
    batches = iter(data.train_dataloader())
    next(batches)  # the workers' start-up
    start, tokens = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        x, _ = next(batches)
        tokens += x.numel()
    del batches
    return tokens / (time.perf_counter() - start)


def measure_streaming(files: list[str], tokenizer: Path, folder: Path, args: argparse.Namespace) -> None:
    rows, block = [], 128 if args.smoke else 1024
    # data.val_docs: its default 1000, or a quarter of the first shard's documents when it holds fewer (the
    # held-out documents come first: the first streaming reader would have none left to train on).
    val_docs = max(1, min(1000, len(read_documents(files[:1])) // 4))
    shape = ["--data.val_docs", str(val_docs), "--data.block_size", str(block)]
    shape += ["--model.n_layer", "2"] if args.smoke else []
    for round_index in range(args.repeats):
        # A fresh cache: fit tokenizes the validation set before step 1.
        cache = folder / f"stream-cache-{round_index}"
        flags = data_flags(files, tokenizer, cache, args.vocab_size) + shape
        first_batch, step_1, step_s = run_fit(flags, folder / f"run-{round_index}")
        loader = loader_tokens_per_s(
            1.0 if args.smoke else 15.0, data_files=files, vocab_size=args.vocab_size, tokenizer_path=str(tokenizer),
            block_size=block, cache_dir=str(cache), val_docs=val_docs,
        )  # fmt: skip
        rows.append((first_batch, step_1, step_s, 4 * block / step_s, loader))
        print(
            f"  round {round_index + 1}: step 1 starts {first_batch:.1f} s, ends {step_1:.1f} s after launch"
        )
    first_batch, step_1, step_s, consumed, loader = (statistics.median(c) for c in zip(*rows, strict=True))
    print(f"(b) train.py fit (streaming, tokenizer given, validation set tokenized): step 1's batch in hand "
          f"{first_batch:.1f} s after launch, step 1 done at {step_1:.1f} s")  # fmt: skip
    print(f"(b) loader alone, num_workers 2: {loader:,.0f} tokens/s | training consumes {consumed:,.0f} tokens/s "
          f"(4 x {block} tokens per {step_s:.2f} s step) | loader / consumption {loader / consumed:.0f}x")  # fmt: skip


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--size_mb", type=float, default=1000.0, help="corpus size in MB of text")
    add("--repeats", type=int, default=1, help="interleaved rounds; medians are reported")
    add("--vocab_size", type=int, default=32768, help="BPE vocab (gpt2-small's)")
    add("--part", choices=["a", "b", "both"], default="both", help="(a) prepare, (b) streaming")
    add("--smoke", action="store_true", help="tests' size: num_proc 1, 2 layers, blocks of 128, 1 s loads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokenize-bench-") as folder_name:
        folder = Path(folder_name)
        # Fresh Hugging Face caches, so nothing an earlier run converted is found; offline like the tests.
        hf = folder / "hf"
        os.environ.update(HF_HOME=str(hf), HF_DATASETS_CACHE=str(hf / "datasets"), HF_HUB_OFFLINE="1")
        from data.tokenizer import Tokenizer

        start = time.perf_counter()
        files = [str(file) for file in write_corpus(folder, args.size_mb)]
        first_shard = read_documents(files[:1])
        lengths = [len(doc.encode("utf-8")) for doc in first_shard]
        print(f"corpus: {sum(Path(f).stat().st_size for f in files) / 1e6:.0f} MB in {len(files)} JSON-lines shards, "
              f"written in {time.perf_counter() - start:.0f} s; document KB: median {np.median(lengths) / 1e3:.1f}, "
              f"5-95% {np.percentile(lengths, 5) / 1e3:.2f}-{np.percentile(lengths, 95) / 1e3:.1f}, max "
              f"{max(lengths) / 1e3:.0f}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the "
              "runs (other jobs make the figures noisy)")  # fmt: skip
        sample = first_shard[:2000]
        tokenizer = Tokenizer.train(sample, args.vocab_size, show_progress=False)
        tokenizer.save(folder / "tokenizer.json")
        print(f"tokenizer: {tokenizer.vocab_size} tokens trained on {len(sample)} documents")
        if args.part != "b":
            measure_prepare(files, folder / "tokenizer.json", folder, args)
        if args.part != "a":
            measure_streaming(files, folder / "tokenizer.json", folder, args)


if __name__ == "__main__":
    main()
