"""What train.py refuses in one line before Lightning starts or anything is read or written: an unknown
subcommand, a missing config file, a key our classes do not take, a resume or run name that names no usable run
folder, a negative step or epoch limit, an accelerator this machine lacks, cache and run folders it cannot write.
The same checks run twice: on the command line as written, before Lightning is imported (so a refusal costs no
import), and on the parsed config."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from functools import cache
from pathlib import Path

import yaml
from jsonargparse import Namespace, dict_to_namespace

from common.errors import UserError
from common.files import refuse_unwritable_folder

SUBCOMMANDS = ("fit", "validate")  # test and predict need loops that LitGPT does not define
# The config sections and the classes that declare their keys (an __init__'s parameters, or a dataclass's fields:
# LitGPT passes **model_config on to ModelConfig, GPTCheckpoint **kwargs to ModelCheckpoint), as (package, file,
# class): package None is ours. Read from the source with `ast`, not imported: importing any of them imports
# Lightning, most of a refusal's wait. A source not found (another Lightning's layout) leaves its section to the
# parser; a test checks that every key the parser offers is known here.
SECTIONS = {
    "model": ((None, "training/lit_gpt.py", "LitGPT"), (None, "model/config.py", "ModelConfig")),
    "data": ((None, "data/datamodule.py", "TextDataModule"),),
    "samples": ((None, "training/samples.py", "SampleGenerations"),),
    "attention_maps": ((None, "training/attention_maps.py", "AttentionMaps"),),
    "trainer": (("lightning", "pytorch/trainer/trainer.py", "Trainer"),),
    "checkpoint": (
        (None, "checkpoints/settings.py", "GPTCheckpoint"),
        ("lightning", "pytorch/callbacks/model_checkpoint.py", "ModelCheckpoint"),
    ),
}


def refuse_early(args: list[str]) -> None:
    """`refuse_unusable_run` on the command line as written: its config files and --key value overrides (the
    defaults are not known yet: what they would refuse waits for the parsed config)."""
    if not args or args[0].startswith("-"):
        return  # --help, or no subcommand: the parser says what is missing
    if args[0] not in SUBCOMMANDS:
        choices = ", ".join(repr(name) for name in SUBCOMMANDS)
        raise UserError(
            f"unknown subcommand {args[0]!r} (choose from {choices}; see: python train.py --help)"
        )
    view: dict = {}
    for index, arg in enumerate(args[1:], start=1):
        if arg in ("--help", "-h", "--print_config") or arg.startswith("--print_config="):
            return
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            flag, value = arg.split("=", 1)
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            flag, value = arg, args[index + 1]
        else:
            continue  # a flag without a value: the parser's to judge
        if flag == "--config":
            loaded = _read_config(Path(value))
            _refuse_unknown_keys(loaded, f"--config {value}: ")
            _merge(view, loaded)
            view["config"] = [*view.get("config", []), value]
        else:
            given = _nested(flag[2:], _value(value))
            _refuse_unknown_keys(given, "")
            _merge(view, given)
    refuse_unusable_run(Namespace(subcommand=args[0], **{args[0]: dict_to_namespace(view)}), known=False)


def _refuse_unknown_keys(given: dict, where: str) -> None:
    for section, value in given.items():
        known = section_keys(section) if section in SECTIONS and isinstance(value, dict) else None
        if known is None:  # not a section of keys, or its classes' source not found: the parser's to judge
            continue
        for key in value:
            key = key.removesuffix("+")  # --trainer.callbacks+=...: appended to the list
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {section}.{close[0]}? " if close else ""
                raise UserError(
                    f"{where}{section}.{key} is not a key ({hint}see: python train.py fit --help)"
                )


@cache
def section_keys(section: str) -> frozenset[str] | None:
    """The keys of a config section (SECTIONS), from the source of its classes; None where one is not found."""
    keys: set[str] = set()
    for package, file, name in SECTIONS[section]:
        if package is None:
            root = Path(__file__).resolve().parents[1]
        else:
            spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
            root = Path(spec.origin).parent if spec and spec.origin else None
        try:
            tree = ast.parse((root / file).read_text(encoding="utf-8"))
            cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
        except (TypeError, OSError, SyntaxError, StopIteration):
            return None
        init = next((node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"),
                    None)  # fmt: skip
        if init is None:  # a dataclass: its annotated fields
            keys |= {node.target.id for node in cls.body if isinstance(node, ast.AnnAssign)}
        else:
            keys |= {arg.arg for arg in [*init.args.args[1:], *init.args.kwonlyargs]}
    return frozenset(keys)


def _read_config(path: Path) -> dict:
    if not path.is_file():
        shipped = (
            ", ".join(sorted(p.name for p in Path("configs").glob("*.yaml")))
            if Path("configs").is_dir()
            else ""
        )
        hint = f" (configs/ holds {shipped})" if shipped else ""
        raise UserError(f"--config {path}: no such file{hint}")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        where = " ".join(str(err).split()).replace('"<unicode string>"', str(path))
        raise UserError(f"--config {path}: not valid YAML: {where}") from None
    return loaded if isinstance(loaded, dict) else {}


def _value(text: str):
    """A command-line value as the parser reads it: YAML (`-5` is a number, `null` None), else the text."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _nested(dotted: str, value) -> dict:
    view: dict = {}
    *parents, leaf = dotted.split(".")
    inner = view
    for part in parents:
        inner = inner.setdefault(part, {})
    inner[leaf] = value
    return view


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def refuse_unusable_run(parsed, known: bool = True) -> None:
    """One line, before anything is read or written, for a run that could not be found or written; `known=False`
    for the command line as written, where a key without a value is not set (and the accelerator waits: its
    check imports Lightning)."""
    subcommand = parsed.get("subcommand")
    config = parsed[subcommand] if subcommand else parsed
    trainer, data = (section if isinstance(section, Namespace) else Namespace() for section in
                     (config.get("trainer"), config.get("data")))  # fmt: skip
    if config.get("ckpt_path") == "last" and not config.get("config") and not config.get("run_name"):
        # Without them `last` would mean runs/default, a new run with the default settings.
        raise UserError(
            "--ckpt_path last resumes the run that --config or --run_name names, and neither was given; "
            "resume a run from its folder with --ckpt_path runs/<run>"
        )
    name = config.get("run_name")
    if name and (name in (".", "..") or any(sep and sep in name for sep in (os.sep, os.altsep, "/"))):
        # The run folder is default_root_dir/run_name: a path here would train (and write) outside it.
        raise UserError(
            f"--run_name {name!r}: a run name is one folder name under trainer.default_root_dir, without "
            "'/' or '..'; pick a plain name, and --trainer.default_root_dir for where runs go"
        )
    for key in ("max_steps", "max_epochs"):  # Lightning's own check is a 38-line traceback
        value = trainer.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < -1:
            raise UserError(f"--trainer.{key} {value}: give a count, or -1 for no limit")
    if known:
        refuse_missing_accelerator(trainer.get("accelerator"))
    if isinstance(data.get("cache_dir"), str):
        cache = Path(data.cache_dir).expanduser()
        if not cache.is_dir():  # one already there may be a read-only prepared cache
            refuse_unwritable_folder(cache, "--data.cache_dir")
    if subcommand in ("fit", None) and isinstance(trainer.get("default_root_dir"), str):
        refuse_unwritable_folder(Path(trainer.default_root_dir), "--trainer.default_root_dir")


def refuse_missing_accelerator(accelerator) -> None:
    """One line for a `trainer.accelerator` that is unknown or that this machine lacks (Lightning raises a
    traceback for these, and for `tpu` without torch_xla a ModuleNotFoundError); an Accelerator object is its own."""
    if not isinstance(accelerator, str) or accelerator == "auto":
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry

    def available(name: str) -> bool:
        return AcceleratorRegistry[name]["accelerator"].is_available()

    known = accelerator == "gpu" or accelerator in AcceleratorRegistry
    wanted = ("cuda", "mps") if accelerator == "gpu" else (accelerator,)  # "gpu" is whichever Lightning finds
    if known and any(available(name) for name in wanted):
        return
    here = ", ".join(name for name in AcceleratorRegistry if available(name))  # only for the error line
    if not known:
        raise UserError(
            f"--trainer.accelerator {accelerator}: not an accelerator name (auto, gpu, "
            f"{', '.join(AcceleratorRegistry)}; available here: {here})"
        )
    raise UserError(
        f"--trainer.accelerator {accelerator}: not available on this machine (available: {here}); "
        "use --trainer.accelerator auto (or cpu)"
    )
