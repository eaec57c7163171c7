"""The engine's side of its wire to its parent (`serve_engine`), written once for the engine process (child.py) and the
Ray actor (ray_engine.py), each of which runs an in-process LocalEngine inside: the Start / Ready-or-Failed exchange,
a heartbeat each second, the parent's messages read on a thread of their own, render jobs in turn (how far each is,
its finished file renamed only once the parent says Go), the live sessions beside them (LocalEngine.hear), and Stop.

Messages in (messages.py): Start, Render, Cancel, Go, Stop, and a live session's. Out: Beat, Ready, Failed (no
engine), Progress, Commit (the file is complete: answered Go or Cancel before its rename), then the job's Outcome;
and a live session's."""

from __future__ import annotations

import os
import queue
import resource
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

from ditto_fast.handles import messages as m
from ditto_fast.handles.local import LocalEngine
from ditto_fast.handles.outcome import out_of_memory

BEAT_S = 1.0                # how often the engine says it is alive
PROGRESS_EVERY_S = 0.2      # the most often a render's progress is sent

# the engine for a Start: loaded (or loaded at its first job), its sessions' messages handed to `tell`
Load = Callable[[m.Start, Callable[[Any], None]], LocalEngine]


class Channel:
    """The connection to the parent, written from the render, heartbeat and session threads."""

    def __init__(self, conn: Connection):
        self.conn, self._lock = conn, threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            self.conn.send(message)


def lift_memory_cap() -> None:
    """Out of memory at a cap (child.py's), and about to exit: the cap lifted, so that the last words can be written
    (pickling them needs memory too: under the cap that failed, and the parent heard only that the process ended)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        except (ValueError, OSError):
            pass


def serve_engine(conn: Connection, load: Load, exit: Callable[[int], None] = os._exit) -> int:
    """Serve the parent at the other end of `conn` until it says Stop (returns 0, every session ended cleanly) or is
    gone (`exit(0)`; after a fatal render, `exit(3)`: the engine must go). `load(start, tell)`: the engine."""
    channel = Channel(conn)
    start: m.Start = conn.recv()
    threading.Thread(target=_beat, args=(channel, exit), name="ditto-fast-engine-beat", daemon=True).start()
    try:
        engine = load(start, channel.send)
    except Exception as e:  # noqa: BLE001 - the parent says why no engine started
        channel.send(_failed(e, start.memory_bytes))
        return 0
    channel.send(m.Ready({"pid": os.getpid(),                      # the load said here, not by the first job
                          "load_seconds": engine.renderer.told_load() if engine.loaded else None}))
    inbox: queue.Queue = queue.Queue()
    answers: queue.Queue = queue.Queue()
    cancelled: set[str] = set()
    threading.Thread(target=_reader, args=(conn, inbox, answers, cancelled, engine, exit),
                     name="ditto-fast-engine-reader", daemon=True).start()
    while True:
        message = inbox.get()
        if isinstance(message, m.Stop):
            engine.close()                  # each session ended, its file complete
            return 0
        if isinstance(message, m.Render):
            _render(engine, message.job, channel, answers, cancelled, exit)
        elif isinstance(message, m.Open):   # a session for an engine not loaded yet: loaded first, here
            if _loaded(engine, lambda line, code: channel.send(m.SessionFailed(message.id, line, code))):
                engine.hear(message)


def _failed(e: BaseException, memory: int | None) -> m.Failed:
    from ditto_fast.core.errors import DittoError

    if isinstance(e, DittoError):
        return m.Failed(str(e), e.exit_code)
    if out_of_memory(e) and memory:
        said = m.Failed(f"the engine ran out of memory loading its networks within its cap of "
                        f"{memory / (1 << 30):.2f} GiB; give --engine-memory more", 2)
    else:
        said = m.Failed(f"the engine could not start: {type(e).__name__}: {e}", 1)
    lift_memory_cap()
    return said


def _loaded(engine: LocalEngine, refuse: Callable[[str, int], None]) -> bool:
    """Whether `engine` has its networks, loading them now if not (a Ray actor of a batch loads with its first job);
    `refuse(line, exit_code)` hears why they cannot load."""
    from ditto_fast.core.errors import DittoError

    if engine.loaded:
        return True
    try:
        engine.start()
        return True
    except DittoError as e:
        refuse(str(e), e.exit_code)
    except Exception as e:  # noqa: BLE001 - said as the job's or the session's error
        refuse(_failed(e, None).line, 1)
    return False


def _reader(conn: Connection, inbox: queue.Queue, answers: queue.Queue, cancelled: set[str],
            engine: LocalEngine, exit: Callable[[int], None]) -> None:
    """Read the parent's messages: cancels take effect at once, answers to a commit go to `answers`, a live
    session's to the `engine`'s sessions, jobs wait in `inbox`. The parent gone: exit."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            exit(0)
            return
        if isinstance(message, m.Cancel):
            cancelled.add(message.token)
        if isinstance(message, (m.Cancel, m.Go)):
            answers.put(message)
        elif isinstance(message, m.Open) and not engine.loaded:
            inbox.put(message)
        elif isinstance(message, m.SessionMessage):
            engine.hear(message)
        else:
            inbox.put(message)


def _beat(channel: Channel, exit: Callable[[int], None]) -> None:
    while True:
        try:
            channel.send(m.Beat(time.time()))
        except OSError:
            exit(0)
            return
        time.sleep(BEAT_S)


def _render(engine: LocalEngine, job: Any, channel: Channel, answers: queue.Queue, cancelled: set[str],
            exit: Callable[[int], None]) -> None:
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

    refused: list[tuple] = []
    try:
        if _loaded(engine, lambda line, code: refused.append(("error", line, code))):
            outcome = engine.outcome(job, tick, commit)
        else:
            outcome = refused[0]
    finally:
        cancelled.discard(token)
    if outcome[0] == "fatal":
        lift_memory_cap()
    channel.send(m.Outcome(token, outcome))
    if outcome[0] == "fatal":
        exit(3)
