"""Checks shared by every command that reads a user's file."""

from __future__ import annotations

import os
from pathlib import Path

from ditto_fast.core.errors import InputError


def check_input_file(path: Path, what: str) -> None:
    """InputError (one line naming the file) unless `path` is an existing, non-empty, readable file.

    `what` names the expected file in the fix, e.g. "an audio file (wav, mp3, flac, m4a, ...)".
    """
    if not path.exists():
        raise InputError(f"{path}: file not found; give {what}")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give {what}")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (0 bytes); give {what}")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: file is not readable; check its permissions")
