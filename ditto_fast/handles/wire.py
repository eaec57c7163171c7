"""An engine at the other end of a wire (a multiprocessing Connection: a socket pair to an engine process, a TCP
connection from a Ray actor), seen from its parent (`WiredEngine`): the parent's side of the handshake, written once
for both (the engine's is engine_side.py). One thread reads everything the engine says (heartbeats kept, a live
session's words to its link, the rest to the render waiting on it), so the parent sees the engine go even while idle;
a render waits on its progress within the stall limit, its heartbeat within the heartbeat limit and its length within
the job limit, and answers its commit; a watchdog kills an idle engine that stops beating or whose sessions make no
progress for the stall limit; a lost engine's sessions are told why.

What differs between an engine process and a Ray actor is its life: how one is started (`_launch`), killed
(`_end`), and how its death is said (`_death`); each kind of handle gives those."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

from ditto_fast.core.errors import InputError
from ditto_fast.handles import messages as m
from ditto_fast.handles.base import (EngineDied, EngineError, EngineJob, EngineLimits, EngineState, JobCancelled,
                                     JobTimedOut, carrying)
from ditto_fast.handles.live_link import LiveLink, SessionOrder, state_with
from ditto_fast.handles.outcome import answer
from ditto_fast.media.claims import remove_dead_writers

_EOF = object()             # the engine is gone (in place of its next message)
WATCH_S = 0.5               # how often the watchdog looks at an engine's heartbeat and sessions
DEATH_CHARS = 500           # the most of an engine's cause of death kept (health's last_death, a job's crash cause)


class WiredEngine:
    """A handle (base.EngineHandle) on one engine over a wire: started by start(), one render at a time beside its
    live sessions, restarted on demand. A kind of engine gives `_launch`, `_start_message`, `_end` and `_death`."""

    kind = "wired"
    noun = "its engine"         # the engine in a death's cause: "its process died (SIGKILL)"

    def __init__(self, name: str, limits: EngineLimits):
        self.name, self.limits = name, limits
        self._state = EngineState(name, self.kind)
        self.info: dict[str, Any] = {}                  # what the engine said when it was ready
        self._life: Any = None                          # the current engine (a process, an actor), set by _launch
        self._conn: Connection | None = None
        self._over = threading.Event()                  # its connection ended
        self._inbox: queue.Queue = queue.Queue()
        self._links: dict[str, LiveLink] = {}           # the live sessions of the current engine
        self._why: dict[int, str] = {}                  # id(life) -> why this handle killed it (a hang, a close)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closing = False

    # ------------------------------------------------------------------ what a kind of engine gives
    def _launch(self) -> Connection:
        """Start an engine, set `self._life` (as soon as there is one: close() ends it) and the state's `where`; its
        connection. DittoError when none can start."""
        raise NotImplementedError

    def _start_message(self) -> m.Start:
        raise NotImplementedError

    def _end(self, life: Any, stacks: bool) -> None:
        """Kill the engine `life` (`stacks`: first ask it to say where each thread is, for the log)."""
        raise NotImplementedError

    def _death(self, life: Any) -> str:
        """How the engine `life`, gone or going, ended, in words (its signal, its last lines; its node)."""
        raise NotImplementedError

    def _memory_cap(self, life: Any) -> float | None:
        """The cap (GiB) the engine holds at, if it is at one (a hang from out of memory)."""
        return None

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the engine and wait until its networks are loaded; DittoError (its line and exit code) if it cannot
        render. Any thread may call it."""
        with self._lock:
            if self._life is None:
                self._begin()
            self._wait_ready()

    def restart(self) -> None:
        """Kill what is left of the engine and start a fresh one (counted in restarts); nothing to do when another
        thread restarted it meanwhile."""
        with self._lock:
            if self._state.state in ("idle", "busy") and self._life is not None and not self._over.is_set():
                return
            self._state.restarts += 1
            self._state.state = "restarting"
            self._kill()
            self._begin()
            self._wait_ready()

    def close(self) -> None:
        """Stop the engine: asked to, then killed; an engine still loading is killed at once."""
        self._closing = True
        if not self._lock.acquire(timeout=1.0):     # a start under way holds it: end that start now
            if self._life is not None:
                self._end(self._life, False)
            self._lock.acquire()
        try:
            if self._conn is not None and self._life is not None and not self._over.is_set():
                try:            # the engine ends its sessions cleanly, then exits
                    self._send(m.Stop())
                    self._over.wait(10 + 30 * bool(self._links))
                except (OSError, ValueError):
                    pass
            self._kill(why="was stopped")
            self._state.state = "dead"
        finally:
            self._lock.release()

    def state(self) -> EngineState:
        return state_with(self._state, self._links)

    def _begin(self) -> None:
        """Start an engine and the threads that read and watch it; say Start."""
        self._inbox, self._links, self._over, self.info = queue.Queue(), {}, threading.Event(), {}
        self._conn = conn = self._launch()
        self._state.state, self._state.error = "starting", None
        life, inbox, links, over = self._life, self._inbox, self._links, self._over
        threading.Thread(target=self._read, args=(life, conn, inbox, links, over),
                         name=f"ditto-fast-{self.name}-reader", daemon=True).start()
        threading.Thread(target=self._watch, args=(life, links, over), name=f"ditto-fast-{self.name}-watchdog",
                         daemon=True).start()
        try:
            conn.send(self._start_message())
        except OSError:
            pass                                # gone already: _wait_ready says how it ended

    def _wait_ready(self) -> None:
        inbox, life = self._inbox, self._life
        deadline = time.monotonic() + self.limits.start_s
        while True:
            message = self._next(inbox, deadline, None)
            if self._closing:
                self._kill()
                self._dead("closed while it was loading")
                raise InputError(f"{self.name}: {self._state.error}")
            if message is None:
                self._kill()
                self._dead(f"it did not finish loading within {self.limits.start_s:g} s")
                raise InputError(f"{self.name}: {self._state.error}")
            if isinstance(message, m.Ready):
                self.info = {**message.info, **self.info}     # what _launch heard first (a Ray actor's node)
                self._state.state, self._state.job = "idle", None
                return
            if isinstance(message, m.Failed):
                self._over.wait(5.0)            # it ends by itself
                self._kill(why=message.line)
                self._dead(message.line)
                raise EngineError(message.line, message.exit_code)
            if message is _EOF:
                self._dead(f"{self.noun} ended while loading ({self._death(life)})")
                self._kill()
                raise InputError(f"{self.name}: {self._state.error}")

    def _dead(self, why: str) -> None:
        self._state.state, self._state.error, self._state.job = "dead", why, None

    def _kill(self, stacks: bool = False, why: str | None = None) -> None:
        """Kill the engine (`stacks`: first ask where each thread is, for the log; `why`: what its live sessions are
        told)."""
        life, self._life = self._life, None
        if life is not None:
            if why is not None:
                self._why[id(life)] = why
            self._end(life, stacks)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ the engine's side of the wire
    def _read(self, life: Any, conn: Connection, inbox: queue.Queue, links: dict[str, LiveLink],
              over: threading.Event) -> None:
        """Every message the engine sends: heartbeats kept, a live session's to its link, the rest queued for the
        render; EOF when it is gone (an idle engine that died is marked dead at once, its sessions told why)."""
        while True:
            try:
                message = conn.recv()
            except Exception:  # noqa: BLE001 - EOF, a broken socket, a message that does not unpickle: gone
                break
            if isinstance(message, m.Beat):         # when it came, by this clock (an actor's node has its own)
                self._state.last_beat = time.time()
            elif isinstance(message, m.SessionMessage):
                link = links.get(message.id)
                if link is not None:
                    link.hear(message)
                    if not link.active:
                        links.pop(link.id, None)
            else:
                inbox.put(message)
        over.set()
        inbox.put(_EOF)
        why = self._why.pop(id(life), None)
        if why is None:
            why = f"died ({self._death(life)})"
        carried = len(links)
        for link in list(links.values()):
            link.lost(why)
            links.pop(link.id, None)
        if life is self._life and self._state.state == "idle" and not self._closing:
            doing = carrying(carried) if carried else "idle"
            self._state.last_death = why if why.startswith("hung") else f"died while {doing} ({why[6:-1]})"
            self._dead(self._state.last_death)

    def _watch(self, life: Any, links: dict[str, LiveLink], over: threading.Event) -> None:
        """While `life` is this handle's engine: kill it when it stops beating and no render waits on it (a render's
        own wait does that), or when a live session of it makes no progress for the stall limit."""
        while life is self._life and not over.is_set() and not self._closing:
            time.sleep(WATCH_S)
            if self._state.state != "idle" or life is not self._life:
                continue
            why = None
            beat = self._state.last_beat
            if beat is not None and time.time() - beat > self.limits.beat_s:
                why = f"stopped answering (no heartbeat for {self.limits.beat_s:g} s)"
            stalled = [k for k in list(links.values()) if k.state == "streaming" and
                       time.monotonic() - k.last_change > self.limits.stall_s]
            if why is None and stalled:
                why = f"live session {stalled[0].order.label or stalled[0].id} made no progress for " \
                      f"{self.limits.stall_s:g} s"
            if why is None:
                continue
            cap = self._memory_cap(life)
            why = f"hung: {why}{f', at its memory cap of {cap:.2f} GiB (out of memory)' if cap else ''}; it was killed"
            with self._lock:
                if life is not self._life or self._state.state != "idle":
                    continue
                self._state.last_death = why
                self._dead(why)
                self._kill(stacks=True, why=why)
            return

    def _next(self, inbox: queue.Queue, deadline: float | None, beat_since: float | None) -> Any:
        """The engine's next message; None when `deadline` (monotonic) passes or the engine stops beating."""
        while True:
            now = time.monotonic()
            wait = 0.5 if deadline is None else min(0.5, deadline - now)
            if wait <= 0:
                return None
            try:
                return inbox.get(timeout=wait)
            except queue.Empty:
                pass
            if beat_since is not None and self._state.last_beat is not None and \
                    time.time() - max(self._state.last_beat, beat_since) > self.limits.beat_s:
                return None

    # ------------------------------------------------------------------ a job
    def render(self, job: EngineJob, progress: Callable[[str, int, int], None] | None = None,
               commit: Callable[[], None] | None = None) -> Any:
        """Render `job` on the engine (see base.EngineHandle.render). A dead engine is restarted first."""
        if self._state.state == "dead" or self._life is None:
            self.restart()
        self._state.state, self._state.job = "busy", job.label or str(job.request.output)
        try:
            return self._render(job, progress, commit)
        except (EngineDied, JobCancelled, EngineError, JobTimedOut):
            raise
        except BaseException:       # an interrupt, or this process's own trouble: the engine is let go at once
            self._kill(why="was let go in the middle of a job")
            self._dead("let go in the middle of a job")
            remove_dead_writers(job.request.output)
            raise

    def _render(self, job: EngineJob, progress: Callable[[str, int, int], None] | None,
                commit: Callable[[], None] | None) -> Any:
        inbox, life = self._inbox, self._life
        started = time.monotonic()
        try:
            self._send(m.Render(job))
        except (OSError, ValueError):
            return self._died(job, f"{self.noun} was gone when the job was sent")
        last_progress, cancelled, token = started, False, job.token
        while True:
            deadline = min(last_progress + self.limits.stall_s,
                           started + self.limits.job_s if self.limits.job_s else float("inf"))
            message = self._next(inbox, deadline, time.time())
            if message is None:
                now = time.monotonic()
                if self.limits.job_s and now >= started + self.limits.job_s:      # the job's length, not a hang
                    self._dying(job, f"was stopped: its job ran past the job limit of {self.limits.job_s:g} s")
                    raise JobTimedOut(self.limits.job_s)
                why = f"made no progress for {self.limits.stall_s:g} s" if \
                    now >= last_progress + self.limits.stall_s else \
                    f"stopped answering (no heartbeat for {self.limits.beat_s:g} s)"
                cap = self._memory_cap(life)
                why += f", at its memory cap of {cap:.2f} GiB (out of memory)" if cap else ""
                why = f"hung: {why}; it was killed"
                self._kill(stacks=True, why=why)
                return self._died(job, why)
            if message is _EOF:
                why = self._why.get(id(life))
                return self._died(job, why or f"{self.noun} died ({self._death(life)})")
            if getattr(message, "token", token) != token:
                continue                                # a late word about an earlier job
            if isinstance(message, m.Commit):           # complete: renamed into place unless cancelled now
                try:
                    if cancelled:
                        raise JobCancelled()
                    if commit is not None:
                        commit()
                    self._send_quietly(m.Go(token))
                except JobCancelled:
                    cancelled = True
                    self._send_quietly(m.Cancel(token))
                continue
            if isinstance(message, m.Progress):
                last_progress = time.monotonic()
                if progress is not None and not cancelled:
                    try:
                        progress(message.stage, message.done, message.total)
                    except JobCancelled:                # passed on: the engine stops at its next frame batch
                        cancelled = True
                        self._send_quietly(m.Cancel(token))
                continue
            if not isinstance(message, m.Outcome):
                continue
            self._state.state, self._state.job = "idle", None
            if message.outcome[0] == "fatal":
                self._over.wait(5.0)                    # it exits by itself
            return answer(message.outcome, lambda why: self._dying(job, why))

    def _send(self, message: Any) -> None:
        """One message to the engine (from any thread); OSError when it is gone."""
        conn = self._conn
        if conn is None:
            raise OSError("the engine is gone")
        with self._send_lock:
            conn.send(message)

    def _send_quietly(self, message: Any) -> None:
        try:
            self._send(message)
        except (OSError, ValueError):
            pass                                        # gone: the read loop sees it

    def _died(self, job: EngineJob, why: str) -> Any:
        raise self._dying(job, why)

    def _dying(self, job: EngineJob, why: str) -> EngineDied:
        """Mark the engine dead (`why`), kill what is left of it and its job's partial output; the EngineDied to
        raise."""
        self._state.last_death = why
        self._dead(why)
        self._kill(why=why)
        remove_dead_writers(job.request.output)
        return EngineDied(f"{self.name} {why}")

    # ------------------------------------------------------------------ a live session
    def open_live(self, order: SessionOrder, heard: Callable[[str, Any], None] | None = None) -> LiveLink:
        """Start the live session `order` on this engine, beside any job it renders (a dead engine is started again
        first); its link. DittoError when no engine starts."""
        if self._state.state == "dead" or self._life is None:
            self.restart()
        with self._lock:
            link = LiveLink(order, self._send, self.name, heard)
            self._links[order.id] = link
            try:
                self._send(m.Open(order.id, order))
            except (OSError, ValueError):
                pass                    # gone already: the read loop tells the link why
        return link


class Doorway:
    """Where engines elsewhere (Ray actors) dial their parent: a TCP listener at `host`, on a port of its own, whose
    callers must prove they hold its random key (multiprocessing's HMAC challenge, both ways: no stranger connects or
    sends a pickle) and then say the name they were given; each connection kept for the handle that waits for it."""

    def __init__(self, host: str):
        import secrets

        self.authkey = secrets.token_bytes(32)
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._arrived: dict[str, Connection] = {}
        self._came = threading.Condition()
        threading.Thread(target=self._accept, name="ditto-fast-doorway", daemon=True).start()

    def take(self, name: str, timeout: float) -> Connection | None:
        """The connection of the engine named `name`, once it has dialled (None after `timeout` seconds)."""
        with self._came:
            self._came.wait_for(lambda: name in self._arrived, timeout)
            return self._arrived.pop(name, None)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)       # wakes the accepting thread
        except OSError:
            pass
        self._sock.close()
        with self._came:
            for conn in self._arrived.values():
                conn.close()
            self._arrived.clear()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return                                  # closed
            threading.Thread(target=self._greet, args=(sock,), name="ditto-fast-doorway-greet", daemon=True).start()

    def _greet(self, sock: socket.socket) -> None:
        """The caller's proof and name, within GREET_S (one that says nothing is cut off, not waited for)."""
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import answer_challenge, deliver_challenge

        timer = threading.Timer(GREET_S, _shut, (sock,))
        timer.start()
        conn = Connection(os.dup(sock.fileno()))       # `sock` kept for the timer's shutdown
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            name = conn.recv()
        except (OSError, EOFError, AuthenticationError, ValueError):
            conn.close()
            return
        finally:
            timer.cancel()
            sock.close()
        if not isinstance(name, str):
            conn.close()
            return
        with self._came:
            self._arrived[name] = conn
            self._came.notify_all()


GREET_S = 30.0              # how long a caller of a Doorway has to prove its key and say its name


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
