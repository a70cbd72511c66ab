"""What train.py refuses in one line before Lightning starts or anything is read or written: a resume or run name
that names no usable run folder, a negative step or epoch limit, an accelerator this machine lacks, cache and run
folders it cannot write."""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import UserError
from common.files import refuse_unwritable_folder


def refuse_unusable_run(parsed) -> None:
    """One line, before anything is read or written, for a run that could not be found or written."""
    subcommand = parsed.get("subcommand")
    config = parsed[subcommand] if subcommand else parsed
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
        value = config.trainer.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < -1:
            raise UserError(f"--trainer.{key} {value}: give a count, or -1 for no limit")
    refuse_missing_accelerator(config.trainer.get("accelerator"))
    cache = Path(config.data.cache_dir).expanduser()
    if not cache.is_dir():  # one already there may be a read-only prepared cache
        refuse_unwritable_folder(cache, "--data.cache_dir")
    if subcommand in ("fit", None):
        refuse_unwritable_folder(Path(config.trainer.default_root_dir), "--trainer.default_root_dir")


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
