"""Checks shared by every command that reads a user's file."""

from __future__ import annotations

import hashlib
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


def file_sha256(path: Path, chunk: int = 4 << 20) -> str:
    """sha256 of a whole file, read in 4 MiB chunks (an input's identity in a record or a digest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
