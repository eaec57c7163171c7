"""One server per home: the server's folder under $DITTO_FAST_HOME (its queue's) checked to be on a local disk
(SQLite's WAL shares memory between the queue's users, which a network filesystem cannot), then locked (flock on
`server.lock`, which names the holder's pid) for the server's whole life."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ditto_fast.core.errors import InputError
from ditto_fast.media.partfiles import lock_if_free

LOCK_NAME = "server.lock"
NETWORK_FILESYSTEMS = {0x6969: "NFS", 0x517B: "SMB", 0xFF534D42: "CIFS", 0xFE534D42: "SMB2"}   # statfs f_type


def filesystem_type(folder: Path) -> int | None:
    """statfs(2)'s f_type of the filesystem holding `folder` (Linux); None elsewhere or if it cannot be read."""
    if not sys.platform.startswith("linux"):
        return None
    buffer = ctypes.create_string_buffer(256)            # struct statfs; f_type (a long) comes first
    if ctypes.CDLL(None, use_errno=True).statfs(os.fsencode(folder), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def network_filesystem(f_type: int | None) -> str | None:
    """The network filesystem's name for statfs's `f_type` (NFS, SMB, CIFS, SMB2), None for a local one."""
    return NETWORK_FILESYSTEMS.get(f_type) if f_type is not None else None


def check_local_disk(folder: Path) -> None:
    """InputError if `folder` (the queue's) is on a network filesystem."""
    remote = network_filesystem(filesystem_type(folder))
    if remote:
        raise InputError(f"{folder}: the server's queue is on {remote}, a network filesystem, where SQLite's WAL "
                         "does not work; put DITTO_FAST_HOME on a local disk (the avatars may stay on the share)")


def holder(fd: int) -> int | None:
    """The pid the lock file open at `fd` names (None if it names none yet)."""
    for pause in (0.01, 0.05, 0.1, None):       # the holder writes its pid just after it takes the lock
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if pause is not None:
            time.sleep(pause)
    return None


@contextmanager
def lock_home(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold the server's folder `folder` (made if missing) while the block runs: InputError if it is on a network
    filesystem, or if another server holds it (the line names that server's pid). Yields the lock file. A process
    forked (not exec'd) while it is held holds it too: start engine processes by spawning them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    check_local_disk(folder)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not lock_if_free(fd):
            pid = holder(fd)
            raise InputError(f"{folder.parent}: another `ditto-fast serve` ({f'pid {pid}' if pid else 'pid unknown'})"
                             " is running on this home; stop it first, or give this server its own DITTO_FAST_HOME"
                             ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)                     # the lock goes with the file's last descriptor
