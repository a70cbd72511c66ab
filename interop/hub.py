"""Hugging Face Hub ids: the files a model needs, downloaded (or found in the cache) with `huggingface_hub`.

Only configs, tokenizer files and safetensors weights are fetched; pickled `.bin` weights never are, since
loading them could run code. `huggingface_hub` honours HF_HUB_OFFLINE, HF_HUB_CACHE and HF_TOKEN itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import first_line

from .source import PretrainedError

HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]  # fmt: skip


def offline_fix() -> str:
    """The fix for a model neither cached nor downloadable; HF_HUB_OFFLINE is named only when it is set."""
    offline = (
        " (unset HF_HUB_OFFLINE)" if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0") else ""
    )
    return (
        f"it is not in the Hugging Face cache and the Hub cannot be reached; download it once online{offline}, "
        "point HF_HUB_CACHE at a cache that holds it, or pass a local model folder"
    )


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
        raise PretrainedError(f"Hub model {label}: {offline_fix()}") from err
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
