"""Where things are on disk: the parts of a run directory and the names inside its checkpoints folder.

    runs/<run>/
        config.yaml          the fully resolved config, written when training starts (training/run_config.py)
        checkpoints/         step-<N>.ckpt files, last.ckpt (a hard link to the newest), or sharded folders
        wandb_run_id         the wandb run every resume of this directory logs to
        wandb/               wandb's own files (the logger's save_dir is the run directory)
        attention/           the attention explorer page (training/attention_maps.py)
        writer.lock          held by the one process writing the run (checkpoints/run_lock.py)

    The writing process's temp folder (TMPDIR) is `RunDir.temp`, in the system temp folder but named after the
    run: emptied at each start and removed at its end.

A sharded strategy (FSDP2) writes each checkpoint as a folder: the weight shards, their index SHARDED_INDEX,
and everything else in SHARDED_META. Standard library only: generate.py reads this without Lightning.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAST_NAME = "last.ckpt"
STEP_FILE = re.compile(r"^step-(\d+)\.ckpt$")
SHARDED_META = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint folder
SHARDED_INDEX = ".metadata"  # torch.distributed.checkpoint's index of a sharded folder: which file holds what


@dataclass(frozen=True)
class RunDir:
    """The parts of one run directory, by name; nothing is created or checked here."""

    path: Path

    def __post_init__(self) -> None:  # accept a str, and "~"
        object.__setattr__(self, "path", Path(self.path).expanduser())

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir:
        """The run a checkpoint belongs to: `runs/<run>/checkpoints/<file>` -> `runs/<run>`."""
        return cls(Path(checkpoint).expanduser().parent.parent)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST_NAME

    @property
    def wandb_id_file(self) -> Path:
        return self.path / "wandb_run_id"

    @property
    def wandb(self) -> Path:
        return self.path / "wandb"

    @property
    def attention(self) -> Path:
        return self.path / "attention"

    @property
    def lock(self) -> Path:
        return self.path / "writer.lock"

    @property
    def temp(self) -> Path:
        """The writer's temp folder: in the system one, named after this run's path (short: multiprocessing puts
        Unix sockets under TMPDIR, whose paths may not pass 107 bytes, and a run folder can be deep)."""
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"gqa-run-{digest}"

    def holds_checkpoints(self) -> bool:
        """A run directory, as opposed to a sharded checkpoint folder (also a directory): it has checkpoints/."""
        return self.checkpoints.is_dir()


def step_file_name(step: int) -> str:
    """The name of the checkpoint saved at optimizer step `step`; zero-padded so names sort by step."""
    return f"step-{step:08d}.ckpt"


def step_files(folder: Path) -> dict[int, Path]:
    """{step: path} of the step-named checkpoints in `folder`, by step."""
    matches = ((STEP_FILE.match(path.name), path) for path in folder.iterdir()) if folder.is_dir() else ()
    return dict(sorted((int(match.group(1)), path) for match, path in matches if match))


def is_sharded_checkpoint(path: Path) -> bool:
    """A checkpoint folder written by a sharded strategy: weight shards plus SHARDED_META."""
    return (path / SHARDED_META).is_file()


def checkpoint_dict_file(path: Path) -> Path:
    """The file `torch.load` reads for a checkpoint: the file itself, or a sharded folder's SHARDED_META."""
    return path / SHARDED_META if is_sharded_checkpoint(path) else path
