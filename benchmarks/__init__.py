"""Measurements that print a ratio against a baseline measured in the same run, and the flags they share.

Run each from the repository root as a module, with underscore flags like the other commands:
`python -m benchmarks.decode --prompt_len 64`.
"""

from __future__ import annotations

import argparse

SHAPE_HELP = {
    "vocab_size": "model vocabulary (random tokens)",
    "block_size": "tokens per sequence",
    "n_layer": "model layers",
    "n_head": "query heads",
    "n_kv_head": "key/value heads",
    "n_embd": "model width",
}


def new_parser(doc: str, **shape: int) -> argparse.ArgumentParser:
    """A benchmark's parser, described by its docstring's first paragraph, with a flag for each model-shape
    argument in `shape` (its default)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in shape.items():
        parser.add_argument(f"--{name}", type=int, default=default, help=SHAPE_HELP[name])
    return parser


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The shape flags' values, as ModelConfig and LitGPT take them."""
    return {name: getattr(args, name) for name in SHAPE_HELP}


def describe_shape(args: argparse.Namespace) -> str:
    return (
        f"{args.n_layer} layers, {args.n_embd} wide, {args.n_head} heads / {args.n_kv_head} kv heads, "
        f"vocab {args.vocab_size}"
    )
