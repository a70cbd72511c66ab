"""Choose between online and offline wandb logging without ever prompting for a login."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse


def wandb_has_credentials() -> bool:
    """True when an API key is in the environment or in the netrc file `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def wandb_offline() -> bool:
    """Offline when WANDB_MODE says so, or when it is unset and no credentials are configured."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun", "disabled")
    return not wandb_has_credentials()
