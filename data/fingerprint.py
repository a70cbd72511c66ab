"""Stable content digests: the cache directory names and the `datasets` fingerprints we pass to `map`."""

from __future__ import annotations

import hashlib
import json


def stable_digest(*parts: object, length: int = 32) -> str:
    """Hex digest of JSON-serialisable `parts`; equal inputs give equal digests across runs and machines."""
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:length]
