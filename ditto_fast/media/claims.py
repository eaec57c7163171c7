"""One writer per output path: a render claims its output with a hidden `.NAME.claim` file beside it, flock'd for
as long as the render runs and removed when it ends. A second process that wants the same output is refused,
naming the claimer's pid. The kernel drops the lock when the claimer dies (even by SIGKILL), so a claim file left
behind blocks nobody: the next claimer takes it over, and the next claim in that folder removes it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from glob import escape as glob_escape
from pathlib import Path
from typing import Iterator

from ditto_fast.core.errors import InputError
from ditto_fast.media.partfiles import lock_if_free, remove_stale

_CLAIM = re.compile(r"^\..+\.(mp4|mov|mkv)\.claim$", re.IGNORECASE)   # the containers a render writes
_PID_LINE = re.compile(rb"\d*\n?")                                     # what a claim file holds
_SETTLE_S = (0.01, 0.02, 0.04, 0.08)    # retries before "busy": another process may be looking at a stale claim
_held: dict[Path, list[int]] = {}       # claim file -> [descriptor, depth] of the claims this process holds
_held_guard = threading.Lock()


def claim_file(target: str | os.PathLike) -> Path:
    """The claim file of output `target`: `.NAME.claim` in the same folder."""
    target = Path(target)
    return (target.parent if str(target.parent) else Path(".")) / f".{target.name}.claim"


def _key(claim: Path) -> Path:
    return claim.parent.resolve() / claim.name


def _holder(fd: int) -> str:
    """The pid written in the claim file open at `fd` ("" if none yet)."""
    return os.pread(fd, 32, 0).decode("ascii", "replace").strip()


def _busy(target: Path, pid: str) -> InputError:
    """The error for an output another process has claimed, naming it by the pid in its claim file."""
    who = f"another process (pid {pid})" if pid.isdigit() else "another process"
    return InputError(f"{target}: is being written by {who}; wait for it to finish or choose another output path")


def _locked(fd: int) -> bool:
    """Take the flock, retrying for a moment: a process removing stale claims holds a free one only briefly."""
    for pause in (*_SETTLE_S, None):
        if lock_if_free(fd):
            return True
        if pause is not None:
            time.sleep(pause)
    return False


def _same_file(claim: Path, fd: int) -> bool:
    try:
        return os.stat(claim, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class _Held(Exception):
    """A claim another process holds (args[0]: its pid as written in the file)."""


def _remove_if_stale(claim: Path, wait: bool) -> None:
    """Remove claim file `claim` if no process holds it (waiting a moment for its lock when `wait`); _Held with the
    holder's pid if one does."""
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return                                  # no claim file: nobody claims it
    try:
        if not (_locked(fd) if wait else lock_if_free(fd)):
            raise _Held(_holder(fd))
        if _PID_LINE.fullmatch(os.pread(fd, 64, 0)) and _same_file(claim, fd):
            claim.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _remove_stale_claims(folder: Path) -> None:
    """Remove the claim files in `folder` left by killed processes (nobody holds them)."""
    try:
        names = [e.name for e in os.scandir(folder) if _CLAIM.match(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        try:
            _remove_if_stale(folder / name, wait=False)
        except (_Held, OSError):
            pass


def check_unclaimed(target: str | os.PathLike) -> None:
    """InputError naming the pid if another process holds `target`'s claim; a claim file nobody holds (its process
    was killed) is removed. Creates nothing."""
    target = Path(target)
    claim = claim_file(target)
    if _key(claim) in _held:
        return
    try:
        _remove_if_stale(claim, wait=True)
    except _Held as held:
        raise _busy(target, held.args[0]) from None


def _acquire(target: Path, claim: Path) -> int:
    """The descriptor holding `claim`'s flock, with this process's pid written in it; InputError if another holds it."""
    _remove_stale_claims(claim.parent)           # claims of killed processes in that folder
    while True:
        try:
            fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise InputError(f"{target}: cannot create its claim file {claim.name} ({e.strerror or e}); choose "
                             "another output path") from None
        try:
            if not _locked(fd):
                raise _busy(target, _holder(fd))
            if _same_file(claim, fd):        # not removed as stale between open and flock: ours
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextmanager
def claimed(target: str | os.PathLike) -> Iterator[Path]:
    """Hold the claim on output `target` while the block runs (re-entrant within a process); InputError naming the
    pid of another process that holds it. The claim file is removed when the outermost block ends."""
    target = Path(target)
    claim = claim_file(target)
    key = _key(claim)
    with _held_guard:
        entry = _held.get(key)
        if entry is None:
            entry = _held[key] = [_acquire(target, claim), 0]
        entry[1] += 1
    try:
        yield claim
    finally:
        with _held_guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                if _same_file(claim, entry[0]):
                    claim.unlink(missing_ok=True)
                os.close(entry[0])


__all__ = ["check_unclaimed", "claim_file", "claimed"]


def remove_dead_writers(target: str | os.PathLike, wait_s: float = 10.0) -> None:
    """Remove what writers of `target` that were killed left beside it: their claims, and their hidden temporary
    outputs once the ffmpeg that wrote each has finished (it holds the file's lock until then; at most `wait_s`
    seconds). Never a live writer's."""
    target = Path(target)
    _remove_stale_claims(target.parent)
    deadline = time.monotonic() + wait_s
    while True:
        remove_stale(target.parent, "part")
        left = list(target.parent.glob(f".{glob_escape(target.name)}.part*"))
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.1)
