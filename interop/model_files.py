"""Reading a model's JSON files (config.json, generation_config.json), every field type-checked into one line;
shared by the tokenizer reader (tokenizer_files.py) and the config reader (hf_folder.py)."""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError

TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}


class ModelFileError(UserError):
    """A model file with a field we cannot use; the message names the file and the key."""


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object, as a dict; anything else is one line naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path} is not valid JSON ({err}); restore the file") from err
    if not isinstance(value, dict):
        raise ModelFileError(f"{path} holds a JSON {type(value).__name__}, not an object; restore the file")
    return value


def is_type(value, kind: type) -> bool:
    """Whether a JSON value is of `kind` (a bool is no number; an int is a float)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def check_types(
    fields: dict, source: str | Path, types: dict[str, type], nullable: tuple[str, ...] = ()
) -> None:
    """One ModelFileError naming `source` and the first key of `types` whose value has another type."""
    for key, kind in types.items():
        value = fields.get(key)
        if key in fields and not (is_type(value, kind) or (value is None and key in nullable)):
            raise ModelFileError(f"{source}: field {key}={value!r} must be {TYPE_NAMES[kind]}; fix the file")


def check_ids(fields: dict, source: str | Path, keys: tuple[str, ...]) -> None:
    """Token-id fields: null, one id, or a list of ids."""
    for key in keys:
        value = fields.get(key)
        if not all(is_type(i, int) and i >= 0 for i in (value if isinstance(value, list) else [value or 0])):
            raise ModelFileError(
                f"{source}: field {key}={value!r} must be a token id or a list of ids; fix it"
            )
