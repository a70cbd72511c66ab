"""train.py whose tokenizer training takes SLOW_TOKENIZER_S seconds longer: data work outlasting a timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import data.tokenizer  # noqa: E402
import train  # noqa: E402

_real_train = data.tokenizer.Tokenizer.train.__func__


def _slow_train(cls, *args, **kwargs):
    delay = float(os.environ.get("SLOW_TOKENIZER_S", "0"))
    print(f"tokenizer training waited {delay} s on purpose", file=sys.stderr, flush=True)
    time.sleep(delay)
    return _real_train(cls, *args, **kwargs)


data.tokenizer.Tokenizer.train = classmethod(_slow_train)

if __name__ == "__main__":
    sys.exit(train.main())
