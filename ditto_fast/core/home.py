"""Where ditto-fast keeps what it makes: the store root (avatars, probes), from $DITTO_FAST_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def store_root() -> Path:
    """The store root: $DITTO_FAST_HOME, else ~/.cache/ditto-fast (read on every call)."""
    env = os.environ.get("DITTO_FAST_HOME")
    return Path(env).expanduser() if env else Path("~/.cache/ditto-fast").expanduser()
