"""The engine process (`python -m ditto_fast.handles.child FD PARENT_PID`): loads the networks once (an in-process
LocalEngine, local.py, which it runs inside), then renders the
jobs its parent sends over the socket FD, one at a time, and carries the live sessions it sends beside them (each on
a thread of its own: engine_sessions.py), saying how far it is and that it is alive (a heartbeat each second). It
dies with its parent, and its ffmpegs with it; out of memory, it says so and exits, so that its parent starts a
fresh one.

Messages in (messages.py): Start, Render, Cancel, Go, Stop, and a live session's. Out: Beat, Ready, Failed (no
engine), Progress, Commit (the file is complete: answered Go or Cancel before its rename), then the job's Outcome;
and a live session's."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ditto_fast.handles import messages as m
from ditto_fast.handles.local import LocalEngine       # imported before the memory cap applies
from ditto_fast.handles.outcome import out_of_memory

BEAT_S = 1.0                # how often the engine says it is alive
PROGRESS_EVERY_S = 0.2      # the most often a render's progress is sent
_PR_SET_PDEATHSIG = 1


class _Channel:
    """The socket to the parent, written from the render and heartbeat threads."""

    def __init__(self, conn: Connection):
        self.conn, self._lock = conn, threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            self.conn.send(message)


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
    if limit:       # the soft limit: lifted (_lift_memory_cap) only to say why this process ends
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _lift_memory_cap() -> None:
    """Out of memory at the cap, and about to exit: the cap lifted, so that the last words can be written (pickling
    them needs memory too: under the cap that failed, and the parent heard only that the process ended)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        except (ValueError, OSError):
            pass


def _reader(conn: Connection, inbox: queue.Queue, answers: queue.Queue, cancelled: set[str],
            engine: LocalEngine) -> None:
    """Read the parent's messages: cancels take effect at once, answers to a commit go to `answers`, a live
    session's to the `engine`'s sessions, jobs wait in `inbox`. The parent gone: exit."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if isinstance(message, m.Cancel):
            cancelled.add(message.token)
        if isinstance(message, (m.Cancel, m.Go)):
            answers.put(message)
        elif isinstance(message, m.SessionMessage):
            engine.hear(message)
        else:
            inbox.put(message)


def _beat(channel: _Channel) -> None:
    while True:
        try:
            channel.send(m.Beat(time.time()))
        except OSError:
            os._exit(0)
        time.sleep(BEAT_S)


def _render(engine: LocalEngine, job: Any, channel: _Channel, answers: queue.Queue, cancelled: set[str]) -> None:
    """Run the job (its rename only once the parent says go) and send its outcome; out of memory, exit after it."""
    from ditto_fast.handles.base import JobCancelled

    token, last = job.token, [0.0]

    def tick(stage: str, done: int, total: int) -> None:
        if token in cancelled:
            raise JobCancelled()
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or done == total:
            last[0] = now
            channel.send(m.Progress(token, stage, done, total))

    def commit() -> None:
        channel.send(m.Commit(token))
        while True:
            said = answers.get()
            if said.token == token:
                if isinstance(said, m.Cancel):
                    raise JobCancelled()
                return

    try:
        outcome = engine.outcome(job, tick, commit)
    finally:
        cancelled.discard(token)
    if outcome[0] == "fatal":
        _lift_memory_cap()
    channel.send(m.Outcome(token, outcome))
    if outcome[0] == "fatal":
        os._exit(3)


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # a Ctrl-C at the terminal is the parent's to handle
    faulthandler.enable()                               # a crash prints where each thread was (to the parent's log)
    faulthandler.register(signal.SIGUSR1, all_threads=True)     # asked before a hung engine is killed
    conn = Connection(fd)
    channel = _Channel(conn)
    start: m.Start = conn.recv()
    setup, memory = start.setup, start.memory_bytes
    import ditto_fast.media.ffpipe as ffpipe

    ffpipe.FFMPEG_OWN_SESSION = False       # this process's group: its ffmpegs die with it when its parent kills it
    _group_dies_with_me()                   # ... and when it dies with its parent
    threading.Thread(target=_beat, args=(channel,), name="ditto-fast-engine-beat", daemon=True).start()
    try:
        _limit_memory(memory)
        from ditto_fast.core.errors import DittoError
        from ditto_fast.core.memory import reuse_freed_memory

        reuse_freed_memory()
        engine = LocalEngine(setup, tell=channel.send).start()
    except DittoError as e:
        channel.send(m.Failed(str(e), e.exit_code))
        return 0
    except Exception as e:  # noqa: BLE001 - the parent says why no engine started
        if out_of_memory(e) and memory:
            said = m.Failed(f"the engine ran out of memory loading its networks within its cap of "
                            f"{memory / (1 << 30):.2f} GiB; give --engine-memory more", 2)
        else:
            said = m.Failed(f"the engine could not start: {type(e).__name__}: {e}", 1)
        _lift_memory_cap()
        channel.send(said)
        return 0
    channel.send(m.Ready({"pid": os.getpid(), "load_seconds": engine.renderer.told_load()}))   # not the first job's
    inbox: queue.Queue = queue.Queue()
    answers: queue.Queue = queue.Queue()
    cancelled: set[str] = set()
    threading.Thread(target=_reader, args=(conn, inbox, answers, cancelled, engine),
                     name="ditto-fast-engine-reader", daemon=True).start()
    while True:
        message = inbox.get()
        if isinstance(message, m.Stop):
            engine.close()                  # each session ended, its file complete
            return 0
        if isinstance(message, m.Render):
            _render(engine, message.job, channel, answers, cancelled)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
