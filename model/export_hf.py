"""Export a checkpoint to a Hugging Face `LlamaForCausalLM` folder that `from_pretrained` loads.

    python -m model.export_hf --checkpoint runs/x --out exports/x [--force] [--dtype bfloat16]

The folder is written into a temporary sibling and renamed into place, so an interrupted export never
leaves a half-written folder at `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from .checkpoint import CheckpointError, load_checkpoint
from .gpt import GPT
from .hf import WEIGHTS_NAME, hf_config_dict, to_hf_state_dict

EOS_TOKEN = "<|endoftext|>"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXIT_ERROR, EXIT_OUT_EXISTS = 1, 2


class OutputExistsError(FileExistsError):
    """`--out` exists and `--force` was not given."""


def export_hf(model: GPT, tokenizer_json: str, out_dir: str | Path, force: bool = False) -> Path:
    """Write `model` and its tokenizer as a Hugging Face Llama folder at `out_dir` and return its path.

    Weights keep the model's dtype. An existing `out_dir` is replaced only with `force`, and only once the
    new folder is complete.
    """
    out = Path(out_dir).expanduser()
    refuse_existing(out, force)
    eos_id = special_token_id(tokenizer_json, EOS_TOKEN)
    dtype = next(model.parameters()).dtype
    with staged_directory(out) as staging:
        write_json(staging / "config.json", hf_config_dict(model.config, dtype, eos_id, eos_id))
        save_file(to_hf_state_dict(model), staging / WEIGHTS_NAME, metadata={"format": "pt"})
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        write_json(staging / "tokenizer_config.json", tokenizer_config(model.config.block_size))
        # pad = eos keeps transformers' generate from warning that no pad token is set.
        generation = {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id}
        write_json(staging / "generation_config.json", generation)
    return out


def refuse_existing(out: Path, force: bool) -> None:
    """Raise OutputExistsError unless `out` is free or `force` allows replacing it."""
    if out.exists() and not force:
        raise OutputExistsError(f"{out} already exists; pass --force to replace it")


def special_token_id(tokenizer_json: str, content: str) -> int:
    """The id of a special token in a `tokenizers` JSON; a tokenizer without it cannot mark documents."""
    for token in json.loads(tokenizer_json).get("added_tokens", []):
        if token.get("content") == content:
            return int(token["id"])
    raise ValueError(f"tokenizer has no {content} special token; train it with {content} as a special token")


def tokenizer_config(block_size: int) -> dict:
    """tokenizer_config.json for `AutoTokenizer`: the fast tokenizer as is, no added BOS, no clean-up."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "model_max_length": block_size,
        "add_bos_token": False,
        "add_eos_token": False,
        # Byte-level BPE already round-trips spaces; the clean-up would change decoded text.
        "clean_up_tokenization_spaces": False,
    }


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextlib.contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield an empty sibling of `out`; on success it replaces `out`, on any error it is removed.

    A sibling (same filesystem) makes the final rename atomic. The old `out`, if any, is moved aside
    first and deleted only after the new folder is in place, so a failed rename can put it back.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staging
        _publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _publish(staging: Path, out: Path) -> None:
    if not out.exists():
        staging.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    out.rename(old / out.name)
    try:
        staging.rename(out)
    except BaseException:
        (old / out.name).rename(out)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m model.export_hf", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a .ckpt file or a run directory")
    parser.add_argument("--out", required=True, help="folder to create, e.g. exports/<run>")
    parser.add_argument("--force", action="store_true", help="replace --out if it already exists")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weight dtype (default: as trained)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; user mistakes print one `error:` line to stderr and return a non-zero code."""
    args = parse_args(argv)
    try:
        refuse_existing(Path(args.out).expanduser(), args.force)  # before reading a possibly large checkpoint
        loaded = load_checkpoint(args.checkpoint)
        model = loaded.model if args.dtype is None else loaded.model.to(DTYPES[args.dtype])
        out = export_hf(model, loaded.tokenizer_json, args.out, force=args.force)
    except OutputExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_OUT_EXISTS
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    print(f"exported {loaded.path} -> {out} (load with AutoModelForCausalLM.from_pretrained or GPT.from_hf)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
