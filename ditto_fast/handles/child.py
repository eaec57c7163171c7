"""The engine process (`python -c ... child.main FD PARENT_PID`): what a process needs around the engine's side of the
wire (engine_side.serve_engine, which it runs on the socket FD; a Ray actor runs the same one): it dies with its
parent, and its ffmpegs with it; its address space is capped, so that out of memory it says so and exits and its
parent starts a fresh one; a Ctrl-C at the terminal is its parent's; a crash, or its parent's SIGUSR1 before it kills
a hung engine, prints where each thread was."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import resource
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any, Callable

from ditto_fast.handles import messages as m
from ditto_fast.handles.engine_side import serve_engine
from ditto_fast.handles.local import LocalEngine       # imported before the memory cap applies

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); if the parent is gone already, exit now."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _group_dies_with_me() -> None:
    """Kill this process's group (the ffmpegs it starts) once this process is gone, however it ends: a shell in the
    group waits on a pipe only this process holds open, then kills the group. Without it, an encoder whose engine
    was killed with its parent (a SIGKILLed server) would go on writing its hidden partial file."""
    global _GROUP_GUARD
    read_end, _GROUP_GUARD = os.pipe()          # neither end is inherited by the ffmpegs (close_fds)
    try:
        subprocess.Popen(["/bin/sh", "-c", "read _; kill -KILL 0"], stdin=read_end, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    except OSError:
        pass                                    # no shell: the ffmpegs end at their pipe's end instead
    finally:
        os.close(read_end)


_GROUP_GUARD: int | None = None


def _limit_memory(limit: int | None) -> None:
    """Cap this process's address space at `limit` bytes (None: no cap): past it an allocation fails here, and the
    engine exits saying so, instead of the host's OOM killer choosing a process."""
    if limit:       # the soft limit: lifted (engine_side.lift_memory_cap) only to say why this process ends
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _load(start: m.Start, tell: Callable[[Any], None]) -> LocalEngine:
    """The engine this process carries: its memory capped, then its networks loaded."""
    from ditto_fast.core.memory import reuse_freed_memory

    _limit_memory(start.memory_bytes)
    reuse_freed_memory()
    return LocalEngine(start.setup, tell=tell).start()


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # a Ctrl-C at the terminal is the parent's to handle
    faulthandler.enable()                               # a crash prints where each thread was (to the parent's log)
    faulthandler.register(signal.SIGUSR1, all_threads=True)     # asked before a hung engine is killed
    import ditto_fast.media.ffpipe as ffpipe

    ffpipe.FFMPEG_OWN_SESSION = False       # this process's group: its ffmpegs die with it when its parent kills it
    _group_dies_with_me()                   # ... and when it dies with its parent
    return serve_engine(Connection(fd), _load)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
