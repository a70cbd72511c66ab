"""Export a model to a Hugging Face folder that `from_pretrained` loads: `LlamaForCausalLM` for our own, the
class of its architecture (Mistral, Qwen2, Qwen3) for a model that came as one.

    python -m interop.export_hf --checkpoint runs/x --out exports/x [--force] [--dtype bfloat16]

The folder is built under a temporary name and renamed into place, so an interrupted export leaves none.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from common.errors import UserError, disk_error, run_command
from common.files import StagedFolder, refuse_existing
from data.tokenizer import Tokenizer
from model.config import DTYPES
from model.gpt import GPT

from .hf_folder import hf_config_dict, to_hf_state_dict
from .load import export_parser, load_for_export
from .safetensors_file import WEIGHTS_NAME


def export_hf(model: GPT, tokenizer: Tokenizer, out_dir: str | Path, force: bool = False) -> Path:
    """Write `model` (in its dtype) and its tokenizer as a Hugging Face folder at `out_dir`; an existing one is
    replaced only with `force`, once the new folder is complete."""
    out = Path(out_dir).expanduser()
    refuse_existing(out, force)
    rules = tokenizer.rules
    eos = rules.eos_ids[0] if len(rules.eos_ids) == 1 else list(rules.eos_ids)  # one id or a list
    dtype = next(model.parameters()).dtype
    with StagedFolder(out.parent) as staged:
        assert staged.path is not None
        folder = staged.path
        write_json(folder / "config.json", hf_config_dict(model.config, dtype, rules.bos_id, eos))
        write_safetensors(to_hf_state_dict(model), folder / WEIGHTS_NAME)
        # safetensors creates its file 0600; give it the umask's mode, as config.json got, so others can read it.
        os.chmod(folder / WEIGHTS_NAME, stat.S_IMODE((folder / "config.json").stat().st_mode))
        (folder / "tokenizer.json").write_text(tokenizer.backend_json, encoding="utf-8")
        write_json(folder / "tokenizer_config.json", tokenizer_config(model.config.block_size, tokenizer))
        # pad = eos keeps transformers' generate from warning that no pad token is set.
        generation = {"bos_token_id": rules.bos_id, "eos_token_id": eos, "pad_token_id": rules.eos_ids[0]}
        write_json(folder / "generation_config.json", generation)
        staged.publish(out.name, replace=force)
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' save_file, whose I/O errors (a full disk) come as a SafetensorError naming no file: an OSError
    naming `path` instead, so a command says it in one line."""
    try:
        save_file(tensors, path, metadata={"format": "pt"})
    except SafetensorError as err:
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from err


def tokenizer_config(block_size: int, tokenizer: Tokenizer) -> dict:
    """tokenizer_config.json for `AutoTokenizer`: the fast tokenizer as is, the model's BOS rule, no clean-up."""
    rules = tokenizer.rules
    eos = tokenizer.token_text(rules.eos_ids[0])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.token_text(rules.bos_id),
        "eos_token": eos,
        "unk_token": (json.loads(tokenizer.backend_json).get("model") or {}).get("unk_token") or eos,
        "model_max_length": block_size,
        "add_bos_token": rules.add_bos,
        "add_eos_token": False,
        # Byte-level BPE already round-trips spaces; the clean-up would change decoded text.
        "clean_up_tokenization_spaces": False,
    }
    if rules.chat_template is not None:
        config["chat_template"] = rules.chat_template
    return config


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export(args) -> None:
    loaded = load_for_export(args)
    model = loaded.model if args.dtype is None else loaded.model.to(DTYPES[args.dtype])
    try:
        out = export_hf(model, loaded.tokenizer, args.out, force=args.force)
    except OSError as err:  # a full disk is said as every command says it; a read-only folder: another --out
        full = disk_error(err)
        if full is not None:
            raise full from err
        raise UserError(
            f"--out {args.out}: cannot write the export ({err.strerror or err}); pick another folder"
        ) from err
    print(
        f"exported {loaded.source} -> {out} (load with AutoModelForCausalLM.from_pretrained or interop.load_hf)"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 on success, 2 with one `error:` line for a user mistake (common.errors)."""
    parser = export_parser("python -m interop.export_hf", __doc__, "folder to create, e.g. exports/<run>")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weight dtype (default: as trained)")
    return run_command(lambda: export(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
