"""Tokenization throughput: the cached data pipeline (first run) against line-by-line encoding in one process.

    python -m benchmarks.tokenize_throughput [--source input.txt] [--megabytes 50] [--num_proc 2] [--repeats 1]

(Not named tokenize.py: a file of that name in benchmarks/ would shadow the standard library's `tokenize` for
every `python benchmarks/<script>.py`, breaking tracebacks and `inspect.getsource`.)

Both sides use the same trained tokenizer. The pipeline run starts from empty `datasets` and token caches, so
it includes loading the text into Arrow, segmenting, `Dataset.map(batched=True, num_proc=...)` and writing the
flat token files; a second call (a cache hit) is timed too. Prints MB/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from array import array
from pathlib import Path

DEFAULT_SOURCE = Path(__file__).resolve().parents[1] / "data" / "corpora" / "tinyshakespeare.txt"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="text file to repeat")
    parser.add_argument("--megabytes", type=float, default=50.0, help="size of the repeated corpus")
    parser.add_argument("--num_proc", type=int, default=2, help="processes for the pipeline's Dataset.map")
    parser.add_argument("--vocab_size", type=int, default=1024, help="BPE vocab of the shared tokenizer")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds; medians are reported")
    return parser.parse_args()


def write_corpus(source: Path, megabytes: float, folder: Path) -> Path:
    """`source` repeated until the file holds about `megabytes` MB."""
    text = source.read_text(encoding="utf-8")
    copies = max(1, round(megabytes * 1e6 / len(text.encode("utf-8"))))
    corpus = folder / "corpus.txt"
    corpus.write_text(text * copies, encoding="utf-8")
    return corpus


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: the work done, whatever else loads the machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def line_by_line(corpus: Path, tokenizer) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and tokens for encoding each line on its own, in this process."""
    start, start_cpu = time.perf_counter(), cpu_seconds()
    ids = array("H")
    with corpus.open(encoding="utf-8") as lines:
        for line in lines:
            ids.extend(tokenizer.encode(line))
    return time.perf_counter() - start, cpu_seconds() - start_cpu, len(ids)


def pipeline(
    corpus: Path, tokenizer_file: Path, cache_dir: Path, num_proc: int, vocab_size: int
) -> tuple[float, float]:
    """Wall and CPU seconds for `prepare_tokens` with the given tokenizer (its training is not timed)."""
    from data.cache import PrepareSettings, prepare_tokens
    from data.source import CorpusSource

    settings = PrepareSettings(
        source=CorpusSource(data_files=str(corpus)),
        cache_dir=cache_dir,
        vocab_size=vocab_size,
        tokenizer_path=tokenizer_file,
        num_proc=num_proc,
    )
    start, start_cpu = time.perf_counter(), cpu_seconds()
    prepare_tokens(settings)
    return time.perf_counter() - start, cpu_seconds() - start_cpu


def measure_rounds(corpus: Path, tokenizer, folder: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    """Alternate baseline and pipeline so both see the same machine load; each round uses a fresh corpus copy
    (a new path, so nothing is cached yet) and a fresh token cache."""
    rounds = []
    for index in range(args.repeats):
        copy = folder / f"corpus-{index}.txt"
        shutil.copyfile(corpus, copy)
        line_s, line_cpu, line_tokens = line_by_line(copy, tokenizer)
        cache = folder / f"cache-{index}"
        first_s, first_cpu = pipeline(copy, folder / "tokenizer.json", cache, args.num_proc, args.vocab_size)
        hit_s, _ = pipeline(copy, folder / "tokenizer.json", cache, args.num_proc, args.vocab_size)
        pipeline_tokens = sum(path.stat().st_size for path in cache.rglob("*.bin")) // 2
        rounds.append(
            {
                "line_s": line_s,
                "line_cpu": line_cpu,
                "line_tokens": line_tokens,
                "first_s": first_s,
                "first_cpu": first_cpu,
                "hit_s": hit_s,
                "pipeline_tokens": pipeline_tokens,
            }
        )
        print(
            f"round {index + 1}: line by line {line_s:6.1f} s (CPU {line_cpu:6.1f} s), pipeline {first_s:6.1f} s "
            f"(CPU {first_cpu:6.1f} s), cache hit {hit_s * 1000:.0f} ms",
            flush=True,
        )
    return rounds


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="tokenize-bench-") as folder_name:
        folder = Path(folder_name)
        # Fresh Hugging Face caches, so the pipeline's first run cannot hit an earlier run's Arrow files.
        os.environ.update(
            HF_HOME=str(folder / "hf"), HF_DATASETS_CACHE=str(folder / "hf" / "datasets"), HF_HUB_OFFLINE="1"
        )
        from data.tokenizer import Tokenizer

        corpus = write_corpus(args.source, args.megabytes, folder)
        megabytes = corpus.stat().st_size / 1e6
        tokenizer = Tokenizer.train(
            [args.source.read_text(encoding="utf-8")], args.vocab_size, show_progress=False
        )
        tokenizer.save(folder / "tokenizer.json")
        print(
            f"corpus: {megabytes:.1f} MB ({args.source.name} repeated), vocab {tokenizer.vocab_size}, "
            f"{os.cpu_count()} CPUs, {args.repeats} round(s), medians below"
        )
        rounds = measure_rounds(corpus, tokenizer, folder, args)

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rounds)

    line_s, line_cpu, first_s, first_cpu = (
        median("line_s"),
        median("line_cpu"),
        median("first_s"),
        median("first_cpu"),
    )
    print(
        f"line by line, 1 process      : {megabytes / line_s:6.2f} MB/s  wall {line_s:6.1f} s  "
        f"CPU {line_cpu:6.1f} s  {rounds[0]['line_tokens']:,} tokens"
    )
    print(
        f"pipeline, num_proc={args.num_proc}, 1st run: {megabytes / first_s:6.2f} MB/s  wall {first_s:6.1f} s  "
        f"CPU {first_cpu:6.1f} s  {rounds[0]['pipeline_tokens']:,} tokens"
    )
    print(f"pipeline, cache hit          : {median('hit_s') * 1000:.1f} ms")
    print(f"ratio pipeline / line by line: {line_s / first_s:.2f}x wall, {line_cpu / first_cpu:.2f}x CPU")


if __name__ == "__main__":
    main()
