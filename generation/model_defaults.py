"""Sampling defaults that follow the model, as transformers' `generate` does: its generation_config.json."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from common.errors import UserError
from generation.sampling import Sampler
from interop.tokenizer_files import read_generation_config

# transformers' GenerationConfig defaults, used for the fields a model's generation_config.json leaves out.
TRANSFORMERS_SAMPLING = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "repetition_penalty": 1.0,
}


def model_sampler(sampler: Sampler, folder: Path | None, explicit: set[str]) -> Sampler:
    """`sampler` with the fields the user did not set taken from the model's generation_config.json: greedy
    unless it says `do_sample: true`, as in transformers; without the file the command line's defaults stay."""
    path = None if folder is None else Path(folder) / "generation_config.json"
    if path is None or not path.is_file():
        return sampler
    config = read_generation_config(Path(folder))
    if config.get("do_sample", False):
        model = {field: config.get(field, default) for field, default in TRANSFORMERS_SAMPLING.items()}
        if model["top_k"] == 0:  # transformers' "no top-k"
            model["top_k"] = None
    else:  # greedy: the filters do not matter
        model = {"temperature": 0.0}
    chosen = {field: value for field, value in model.items() if field not in explicit}
    if chosen and any(getattr(sampler, field) != value for field, value in chosen.items()):
        shown = ", ".join(f"{field}={value}" for field, value in chosen.items())
        print(
            f"note: sampling as {path} says ({shown}); pass --temperature etc. to override", file=sys.stderr
        )
    try:
        return dataclasses.replace(sampler, **chosen)
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
