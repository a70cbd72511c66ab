"""Export a model to a Hugging Face `LlamaForCausalLM` folder that `from_pretrained` loads.

    python -m interop.export_hf --checkpoint runs/x --out exports/x [--force] [--dtype bfloat16]

--checkpoint is any model name `interop` resolves (our checkpoint, an HF folder or Hub id, a .gguf file); the
folder gets the model's own tokenizer, BOS/EOS ids and chat template.

The folder is written into a temporary sibling and renamed into place, so an interrupted export never
leaves a half-written folder at `--out`. User mistakes print one line and exit with status 2, like
train.py and generate.py (common/errors.py); set GQA_GPT_TRACEBACK=1 for the full traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

from safetensors.torch import save_file

from common.errors import UserError, run_command
from common.files import StagedFolder, refuse_existing
from common.tokens import EOS_TOKEN, added_tokens, split_tokenizer_json
from model.config import DTYPES
from model.gpt import GPT
from model.hf import WEIGHTS_NAME, hf_config_dict, to_hf_state_dict

from .load import load_pretrained


def export_hf(model: GPT, tokenizer_json: str, out_dir: str | Path, force: bool = False) -> Path:
    """Write `model` and its tokenizer as a Hugging Face Llama folder at `out_dir` and return its path.

    Weights keep the model's dtype. An existing `out_dir` is replaced only with `force`, and only once the
    new folder is complete.
    """
    out = Path(out_dir).expanduser()
    refuse_existing(out, force)
    backend_json, rules = tokenizer_rules(tokenizer_json)
    eos_ids, bos_id = rules["eos_ids"], rules["bos_id"]
    eos = eos_ids[0] if len(eos_ids) == 1 else eos_ids  # config files hold one id or a list
    dtype = next(model.parameters()).dtype
    # Files are written plainly into the staged folder: it is published whole, by one rename.
    with StagedFolder(out.parent) as staged:
        assert staged.path is not None
        write_json(staged.path / "config.json", hf_config_dict(model.config, dtype, bos_id, eos))
        save_file(to_hf_state_dict(model), staged.path / WEIGHTS_NAME, metadata={"format": "pt"})
        # safetensors creates its file 0600; give it the umask's mode, as config.json got, so others can read it.
        os.chmod(staged.path / WEIGHTS_NAME, stat.S_IMODE((staged.path / "config.json").stat().st_mode))
        (staged.path / "tokenizer.json").write_text(backend_json, encoding="utf-8")
        config = tokenizer_config(model.config.block_size, backend_json, rules)
        write_json(staged.path / "tokenizer_config.json", config)
        # pad = eos keeps transformers' generate from warning that no pad token is set.
        generation = {"bos_token_id": bos_id, "eos_token_id": eos, "pad_token_id": eos_ids[0]}
        write_json(staged.path / "generation_config.json", generation)
        staged.publish(out.name, replace=force)
    return out


def eos_token_id(tokenizer_json: str) -> int:
    """The id of EOS_TOKEN in a `tokenizers` JSON; a tokenizer without it cannot mark documents."""
    eos = added_tokens(tokenizer_json).get(EOS_TOKEN)
    if eos is None:
        raise UserError(
            f"tokenizer has no {EOS_TOKEN} special token; train it with {EOS_TOKEN} as a special token"
        )
    return int(eos["id"])


def tokenizer_rules(tokenizer_json: str) -> tuple[str, dict]:
    """(the plain `tokenizers` JSON, its rules: eos_ids, bos_id, add_bos, chat_template).

    Our own BPE carries no rules: `<|endoftext|>` ends a text and also starts one, and no BOS is added.
    """
    backend_json, rules = split_tokenizer_json(tokenizer_json)
    if rules is None:
        eos = eos_token_id(tokenizer_json)
        rules = {"eos_ids": [eos], "bos_id": eos, "add_bos": False, "chat_template": None}
    return backend_json, {"bos_id": None, "add_bos": False, "chat_template": None, **rules}


def token_text(backend_json: str, token_id: int | None) -> str | None:
    """The text of one token id in a `tokenizers` JSON (an added token or a vocabulary entry)."""
    spec = json.loads(backend_json)
    by_id = {int(t["id"]): t["content"] for t in spec.get("added_tokens", [])}
    by_id |= {int(i): token for token, i in (spec.get("model") or {}).get("vocab", {}).items()}
    return None if token_id is None else by_id.get(int(token_id))


def tokenizer_config(block_size: int, backend_json: str, rules: dict) -> dict:
    """tokenizer_config.json for `AutoTokenizer`: the fast tokenizer as is, the model's BOS rule, no clean-up."""
    eos = token_text(backend_json, rules["eos_ids"][0])
    unk = (json.loads(backend_json).get("model") or {}).get("unk_token") or eos
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_text(backend_json, rules["bos_id"]),
        "eos_token": eos,
        "unk_token": unk,
        "model_max_length": block_size,
        "add_bos_token": bool(rules["add_bos"]),
        "add_eos_token": False,
        # Byte-level BPE already round-trips spaces; the clean-up would change decoded text.
        "clean_up_tokenization_spaces": False,
    }
    if rules["chat_template"] is not None:
        config["chat_template"] = rules["chat_template"]
    return config


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m interop.export_hf", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a .ckpt, run dir, HF folder, Hub id or .gguf")
    parser.add_argument("--revision", help="branch, tag or commit of a Hub id")
    parser.add_argument("--out", required=True, help="folder to create, e.g. exports/<run>")
    parser.add_argument("--force", action="store_true", help="replace --out if it already exists")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weight dtype (default: as trained)")
    return parser.parse_args(argv)


def export(args: argparse.Namespace) -> None:
    """Read the checkpoint, export it, and say where it went."""
    refuse_existing(Path(args.out).expanduser(), args.force)  # before reading a possibly large checkpoint
    loaded = load_pretrained(args.checkpoint, args.revision)
    model = loaded.model if args.dtype is None else loaded.model.to(DTYPES[args.dtype])
    try:
        out = export_hf(model, loaded.tokenizer.to_json(), args.out, force=args.force)
    except OSError as err:  # a read-only or full destination: the user picks another --out
        raise UserError(
            f"--out {args.out}: cannot write the export ({err.strerror or err}); pick another folder"
        ) from err
    print(
        f"exported {loaded.source} -> {out} (load with AutoModelForCausalLM.from_pretrained or GPT.from_hf)"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 on success, 2 with one `error:` line for a user mistake (common.errors)."""
    return run_command(lambda: export(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
