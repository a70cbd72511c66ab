"""`python -m data.prepare` whose pool workers get stuck mid-part (their temp file open), each after writing its
pid into the folder STUCK_PIDS_DIR: a build to kill -9 at a known point."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import data.documents  # noqa: E402
import data.prepare  # noqa: E402
import data.tokenize_parts  # noqa: E402

_main_pid = os.getpid()
_real_encode = data.documents.encode_segments


def _stuck_encode(*args, **kwargs):
    ids = _real_encode(*args, **kwargs)
    if os.getpid() != _main_pid:
        (Path(os.environ["STUCK_PIDS_DIR"]) / str(os.getpid())).touch()
        time.sleep(3600)
    return ids


data.tokenize_parts.PART_BYTES = 4096  # several parts from a small corpus
data.documents.encode_segments = _stuck_encode

if __name__ == "__main__":
    sys.exit(data.prepare.main())
