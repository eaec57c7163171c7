"""Hidden temporary files beside an output (`.NAME.TAGxxxxxxxx[.suffix]`), flock'd for as long as their writer
lives: the next writer in that folder removes the ones nobody holds (left by a killed process) and never a live one's.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _pattern(tag: str) -> re.Pattern[str]:
    # "." + a name + "." + tag + mkstemp's 8 characters + an optional suffix
    return re.compile(rf"^\..+\.{re.escape(tag)}[a-z0-9_]{{8}}(\.[^./]+)?$")


def lock_if_free(fd: int) -> bool:
    """Take an exclusive flock on `fd` without waiting; False if another process holds one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remove_stale(folder: str | os.PathLike, tag: str) -> list[Path]:
    """Delete the `.NAME.TAG*` files in `folder` that no process holds locked; return them."""
    pattern, removed = _pattern(tag), []
    try:
        entries = [e for e in os.scandir(folder) if pattern.match(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return removed
    for entry in entries:
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            ino = os.fstat(fd).st_ino
            if lock_if_free(fd) and os.stat(entry.path, follow_symlinks=False).st_ino == ino:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def create_locked(target: str | os.PathLike, tag: str, suffix: str = "") -> tuple[Path, int]:
    """A new `.NAME.TAG*SUFFIX` file beside `target` and an open descriptor holding its flock; stale ones of dead
    writers in that folder are removed first. Close the descriptor once the file is renamed or deleted."""
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    remove_stale(parent, tag)
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{tag}", suffix=suffix, dir=parent)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:        # another writer's clean-up may have taken it between mkstemp and flock: then make another
            if os.stat(tmp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return Path(tmp), fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs (in the main thread, where Python raises for them): a file
    made in it is named to its caller before a Ctrl-C can interrupt, which then comes as the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for s in came[:1]:
            signal.raise_signal(s)
