"""Export the adapters of a LoRA run (train.py with model.lora_rank) as the files peft and llama.cpp load:

    python -m interop.export_lora --checkpoint runs/x --out exports/x-adapter        a PEFT folder
    python -m interop.export_lora --checkpoint runs/x --out x-adapter.gguf           a llama.cpp --lora file

A PEFT folder (adapter_config.json, adapter_model.safetensors) loads with `PeftModel.from_pretrained` onto the
Hugging Face model of the base; the GGUF file with llama.cpp's `--lora` onto the base's GGUF. The fused layers
are written apart (q_proj/k_proj/v_proj, gate_proj/up_proj), each with its own pair, as the adapters were trained.
Base and adapters merged into one model: export the run with interop.export_hf or interop.export_gguf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from checkpoints.format import LORA_KEY, META_KEY, STATE_PREFIX, read_checkpoint
from common.errors import UserError, run_command
from common.files import StagedFolder, atomic_path, refuse_existing
from model.config import ModelConfig
from model.gpt import GPT
from model.lora import LoRAConfig, adapters, add_lora

from .export_gguf import gguf_architecture, write_out
from .export_hf import write_safetensors
from .gguf_file import import_gguf
from .hf_folder import empty_model
from .load import export_parser
from .names import INTERLEAVED, Format, row, to_format

PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # where peft puts the Hugging Face model's own module names


def read_adapters(path: str | Path) -> tuple[GPT, dict]:
    """The GPT of a LoRA checkpoint with its adapters and no base weights (they stay on the meta device: an
    export needs the adapters and the shapes only), and the checkpoint's LORA_KEY entry."""
    ckpt, file = read_checkpoint(path)
    lora = ckpt[META_KEY].get(LORA_KEY)
    if lora is None:
        raise UserError(
            f"--checkpoint {file}: holds every weight, not adapters (a run without model.lora_rank); export it "
            "with interop.export_hf or interop.export_gguf"
        )
    model = empty_model(ModelConfig(**ckpt[META_KEY]["model_config"]))
    add_lora(model, LoRAConfig(lora["rank"], lora["alpha"], 0.0, tuple(lora["targets"])))
    state = {name.removeprefix(STATE_PREFIX): tensor for name, tensor in ckpt["state_dict"].items()}
    model.load_state_dict(state, strict=False, assign=True)
    return model, lora


def adapter_tensors(model: GPT, fmt: Format, interleave: bool = False) -> dict[str, torch.Tensor]:
    """Each adapter's A and B under the name of the stored matrix it adapts (interop/names.py): {stored name:
    (A, B)} split per part, B's q/k rows in GGUF llama's RoPE order when `interleave`."""
    pairs = {}
    for name, adapter in adapters(model).items():
        weight = f"{name}.weight"
        parts, i = row(weight)
        b_of = to_format({weight: adapter.lora_b.detach()}, model.config, fmt, interleave)
        for part, a in zip(parts, adapter.lora_a.detach().split(adapter.rank), strict=True):
            stored = getattr(part, fmt).format(i=i)
            pairs[stored] = (a.float().contiguous(), b_of[stored].float().contiguous())
    return pairs


def write_peft(model: GPT, lora: dict, out: Path, force: bool = False) -> Path:
    """A PEFT LoRA folder at `out`: its config and the adapters under Hugging Face module names."""
    refuse_existing(out, force)
    pairs = adapter_tensors(model, "hf")
    tensors = {}
    for stored, (a, b) in pairs.items():
        module = PEFT_PREFIX + stored.removesuffix(".weight")
        tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"] = a, b
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": lora["base"]["name"],
        "revision": lora["base"]["revision"],
        "r": lora["rank"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "target_modules": sorted({stored.split(".")[-2] for stored in pairs}),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    with StagedFolder(out.parent) as staged:
        assert staged.path is not None
        (staged.path / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        write_safetensors(tensors, staged.path / PEFT_WEIGHTS)
        staged.publish(out.name, replace=force)
    return out


def write_gguf_adapter(model: GPT, lora: dict, out: Path, force: bool = False) -> Path:
    """llama.cpp's LoRA adapter file at `out`: general.type adapter, the alpha, and each stored matrix's
    `.lora_a` (r, in) and `.lora_b` (out, r) in float32."""
    gguf = import_gguf()
    refuse_existing(out, force, file=True, suffixes=(".gguf",))
    architecture = gguf_architecture(model.config)
    pairs = adapter_tensors(model, "gguf", interleave=architecture in INTERLEAVED)
    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, architecture)
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(lora["alpha"]))
        for stored, (a, b) in pairs.items():
            writer.add_tensor(f"{stored}.lora_a", a.numpy())
            writer.add_tensor(f"{stored}.lora_b", b.numpy())
        write_out(writer)
    return out


def export(args) -> None:
    out = Path(args.out).expanduser()
    refuse_existing(out, args.force, file=out.suffix == ".gguf", source=Path(args.checkpoint).expanduser())
    model, lora = read_adapters(args.checkpoint)
    write = write_gguf_adapter if out.suffix == ".gguf" else write_peft
    write(model, lora, out, force=args.force)  # a full disk: common.errors says it in one line
    kind = (
        "llama.cpp adapter (--lora)" if out.suffix == ".gguf" else "PEFT folder (PeftModel.from_pretrained)"
    )
    print(
        f"exported the adapters of {args.checkpoint} -> {out}, a {kind} for the base {lora['base']['name']}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 on success, 2 with one `error:` line for a user mistake (common.errors)."""
    parser = export_parser(
        "python -m interop.export_lora", __doc__, "a folder (PEFT) or a .gguf file (llama.cpp) to create"
    )
    return run_command(lambda: export(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
