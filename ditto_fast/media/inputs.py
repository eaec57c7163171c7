"""Checks shared by every command that reads a user's file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ditto_fast.core.errors import InputError
from ditto_fast.core.files import check_regular


def check_input_file(path: Path, what: str) -> None:
    """InputError (one line naming the file) unless `path` is an existing, non-empty, readable regular file.

    `what` names the expected file in the fix, e.g. "an audio file (wav, mp3, flac, m4a, ...)".
    """
    try:
        st = check_regular(path, what)          # a FIFO or a device is refused before anything opens it
    except FileNotFoundError:
        raise InputError(f"{path}: file not found; give {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the file ({e.strerror or e}); give {what}") from None
    if st.st_size == 0:
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
