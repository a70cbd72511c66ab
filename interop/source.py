"""What a model name points at: our checkpoint, a Hugging Face folder, a Hub id or a GGUF file.

Every command resolves a name the same way, in this order:
1. an existing `.gguf` file (checked by its magic bytes);
2. an existing folder with a config.json: a Hugging Face model folder;
3. any other existing path: our `.ckpt` file, run directory or sharded checkpoint folder;
4. `org/name` that is no local path: a Hugging Face Hub id (with an optional revision). A name that looks like a
   path (`./x`, `runs/x`, `x.ckpt`, a folder that exists followed by a name) and does not exist is refused at
   once, without asking the Hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.errors import UserError

SourceKind = Literal["checkpoint", "hf_folder", "hub", "gguf"]
GGUF_MAGIC = b"GGUF"
# The Hub's repo id shape: one "/" between an owner and a name of letters, digits, "-", "_" and ".".
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# How messages name each kind (the kinds themselves are internal).
DESCRIPTIONS = {"checkpoint": "a gqa-gpt checkpoint", "hf_folder": "a Hugging Face folder", "hub": "a Hub model",
                "gguf": "a GGUF file"}  # fmt: skip
PATH_PREFIXES = ("./", "../", "/", "~", "runs/")
PATH_SUFFIXES = (".ckpt", ".gguf", ".safetensors", ".json")
NAME_HELP = (
    "pass a .ckpt file, a run directory, a Hugging Face model folder, a .gguf file or a Hub id (org/name)"
)


class PretrainedError(UserError):
    """A model name that cannot be loaded; one line naming the path or id and the fix."""


@dataclass(frozen=True)
class Source:
    """Where a model came from: `kind`, the local `path` read (a Hub id's snapshot folder), the `name` given."""

    kind: SourceKind
    path: Path
    name: str
    revision: str | None = None

    @property
    def hf_folder(self) -> Path | None:
        """The Hugging Face folder read (its generation_config.json sets sampling defaults), if it is one."""
        return self.path if self.kind in ("hf_folder", "hub") else None

    def __str__(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return (
            f"{self.name}{at} ({DESCRIPTIONS[self.kind]}: {self.path})"
            if self.kind == "hub"
            else f"{self.path} ({DESCRIPTIONS[self.kind]})"
        )


def classify(name: str | Path, revision: str | None = None) -> tuple[SourceKind, Path]:
    """The kind of source `name` is and its local path (for a Hub id: the id itself, not yet downloaded)."""
    text = str(name)
    if not text.strip():
        raise PretrainedError(f"the model name is empty; {NAME_HELP}")
    path = Path(text).expanduser()
    if path.exists():
        if revision is not None:
            raise PretrainedError(
                f"{path}: a revision ({revision}) applies to Hub ids only; drop it for a local path"
            )
        if path.is_file() and _has_gguf_magic(path):
            return "gguf", path
        if path.suffix == ".gguf":
            raise PretrainedError(
                f"{path}: not a GGUF file (its first bytes are not 'GGUF'); the file is damaged"
            )
        if path.is_dir() and (path / "config.json").is_file():
            return "hf_folder", path
        if path.is_dir() and any(path.glob("*.safetensors")):
            raise PretrainedError(
                f"{path}: no config.json next to the safetensors weights; a Hugging Face model folder needs one"
            )
        return "checkpoint", path
    if HUB_ID.match(text) and not _path_shaped(text, path):
        return "hub", Path(text)
    raise PretrainedError(f"{text}: no such file or folder; {NAME_HELP}")


def _path_shaped(text: str, path: Path) -> bool:
    """Whether a name that matches a Hub id is more likely a local path with a typo."""
    return text.startswith(PATH_PREFIXES) or text.endswith(PATH_SUFFIXES) or path.parent.is_dir()


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC
