"""What a model name points at, decided the same way for every command (`classify`; the order is in
docs/pretrained.md). A Hub id is fetched (or found in the cache) by `huggingface_hub`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.errors import UserError, first_line

SourceKind = Literal["checkpoint", "hf_folder", "hub", "gguf"]
GGUF_MAGIC = b"GGUF"
# The Hub's repo id shape: one "/" between an owner and a name of letters, digits, "-", "_" and ".".
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# How messages name each kind (the kinds themselves are internal).
DESCRIPTIONS = {"checkpoint": "a gqa-gpt checkpoint", "hf_folder": "a Hugging Face folder", "hub": "a Hub model",
                "gguf": "a GGUF file"}  # fmt: skip
PATH_PREFIXES = ("./", "../", "/", "~", "runs/")
PATH_SUFFIXES = (".ckpt", ".gguf", ".safetensors", ".json")
# Only configs, tokenizer files and safetensors are fetched: loading pickled `.bin` weights could run code.
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]  # fmt: skip
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
        if self.kind != "hub":
            return f"{self.path} ({DESCRIPTIONS[self.kind]})"
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.name}{at} ({DESCRIPTIONS[self.kind]}: {self.path})"


def resolve(name: str | Path, revision: str | None = None) -> Source:
    """The source behind `name`, a Hub id downloaded (or found in the cache) first."""
    kind, path = classify(name, revision)
    if kind == "hub":
        path = download_snapshot(str(name), revision)
    return Source(kind, path, str(name), revision)


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


def download_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of `repo_id` at `revision` (default: main); errors are one line naming the id."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    label = f"{repo_id}@{revision}" if revision else repo_id
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0")  # named only when it is set
        raise PretrainedError(
            f"Hub model {label}: it is not in the Hugging Face cache and the Hub cannot be reached; download it "
            f"once online{' (unset HF_HUB_OFFLINE)' if offline else ''}, point HF_HUB_CACHE at a cache that "
            "holds it, or pass a local model folder"
        ) from err
    except GatedRepoError as err:
        raise PretrainedError(
            f"Hub model {label} is gated; accept its license on the Hub, then `hf auth login`"
        ) from err
    except RepositoryNotFoundError as err:
        raise PretrainedError(
            f"Hub model {label} does not exist (or is private: `hf auth login`); check the id, or pass a local path"
        ) from err
    except RevisionNotFoundError as err:
        raise PretrainedError(
            f"Hub model {repo_id} has no revision {revision!r}; pass a branch, tag or commit"
        ) from err
    except (HfHubHTTPError, OSError) as err:  # network failures and HTTP errors the cases above do not cover
        raise PretrainedError(
            f"Hub model {label}: download failed ({first_line(err)}); retry or pass a local folder"
        ) from err
    if not (folder / "config.json").is_file():
        raise PretrainedError(
            f"Hub model {label} has no config.json; it is not a transformers model repository"
        )
    if not any(folder.glob("*.safetensors")):
        raise PretrainedError(
            f"Hub model {label} has no safetensors weights (only pickles are unsafe to load); pick a revision "
            "with model.safetensors or convert the weights"
        )
    return folder
