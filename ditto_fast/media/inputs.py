"""Checks shared by every command that reads a user's file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ditto_fast.core.errors import InputError
from ditto_fast.core.files import check_regular, unreadable


def check_input_file(path: Path, what: str) -> None:
    """InputError (one line naming the file) unless `path` is an existing, non-empty, readable regular file.

    `what` names the expected file in the fix, e.g. "an audio file (wav, mp3, flac, m4a, ...)".
    """
    try:
        st = check_regular(path, what)          # a FIFO or a device is refused before anything opens it
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))   # readable by this process
    except OSError as e:
        raise unreadable(path, e, what) from None
    if st.st_size == 0:
        raise InputError(f"{path}: file is empty (0 bytes); give {what}")


def file_sha256(path: Path, chunk: int = 4 << 20) -> str:
    """sha256 of a whole file, read in 4 MiB chunks (an input's identity in a record or a digest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
