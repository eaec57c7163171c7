"""An engine in a child process of this one (`child.py`): a render that segfaults, runs out of memory, is killed or
hangs takes only that process with it. The engine carries live sessions beside its renders (`open_live`), supervised
alike. The parent reads everything the child says on one thread (heartbeats, progress, outcomes, the sessions'
words), so it sees the child die even while idle; a watchdog kills a child that stops beating while no render waits
on it, or whose sessions make no progress for too long; a render's own wait kills one that hangs under it.

Every engine process is started from one thread that lives as long as this process (`_spawner`): Linux's
parent-death signal follows the thread that started a child, so no caller's thread (an HTTP server's worker,
retired when idle) may be that thread."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

import ditto_fast
from ditto_fast.core.errors import InputError, one_line
from ditto_fast.handles.base import (EngineDied, EngineError, EngineJob, EngineLimits, EngineState, JobCancelled,
                                     JobTimedOut, at_memory_cap, carrying, signal_words)
from ditto_fast.handles import messages as m
from ditto_fast.handles.live_link import LiveLink, SessionOrder, labels
from ditto_fast.handles.outcome import answer
from ditto_fast.media.claims import remove_dead_writers

_EOF = object()             # the child is gone (in place of its next message)
WATCH_S = 0.5               # how often the watchdog looks at an engine's heartbeat and sessions
DEATH_CHARS = 500           # the most of an engine's cause of death kept (health's last_death, a job's crash cause)
_CHILD = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from ditto_fast.handles.child import main; "
          "sys.exit(main(sys.argv[1:]))")


class ProcessEngine:
    """A handle on one engine in a child process: started by start(), one render at a time, restarted on demand."""

    kind = "process"

    def __init__(self, setup: Any, name: str = "engine-0", limits: EngineLimits = EngineLimits(),
                 env: dict[str, str] | None = None, output: Callable[[str], None] | None = None):
        """`setup`: the resolved RenderSetup the engine loads (the same bytes as an engine in this process);
        `env`: extra environment (CUDA_VISIBLE_DEVICES for one GPU of several); `output`: hears each line the
        child prints (stderr by default)."""
        self.setup, self.name, self.limits, self.env = setup, name, limits, env or {}
        self.output = output or (lambda line: print(line, file=sys.stderr))
        self._state = EngineState(name, self.kind)
        self.info: dict[str, Any] = {}                  # what the engine said when it was ready (pid, load seconds)
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._links: dict[str, LiveLink] = {}           # the live sessions of the current engine process
        self._why: dict[int, str] = {}                  # pid -> why this process killed it (a hang, a close)
        self._said: deque[str] = deque(maxlen=5)        # the child's last lines, quoted when it dies
        self._crashed_in: dict[int, str] = {}           # pid -> the frame a crash's dump names (faulthandler's)
        self._relays: dict[int, threading.Thread] = {}  # pid -> the thread passing on what it prints
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closing = False

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the child and wait until its networks are loaded; DittoError (its line and exit code) if it cannot
        render. Any thread may call it."""
        with self._lock:
            if self._proc is None:
                self._spawn()
            self._wait_ready()

    def restart(self) -> None:
        """Kill what is left of the engine and start a fresh one (counted in restarts); nothing to do when another
        thread restarted it meanwhile."""
        with self._lock:
            if self._state.state in ("idle", "busy") and self.pid is not None:
                return
            self._state.restarts += 1
            self._state.state = "restarting"
            self._kill()
            self._spawn()
            self._wait_ready()

    def close(self) -> None:
        """Stop the engine: asked to, then killed; an engine still loading is killed at once."""
        self._closing = True
        if not self._lock.acquire(timeout=1.0):     # a start under way holds it: end that start now
            _kill_group(self._proc)
            self._lock.acquire()
        try:
            if self._conn is not None and self._proc is not None and self._proc.poll() is None:
                try:            # the engine ends its sessions cleanly, then exits
                    self._send(m.Stop())
                    self._proc.wait(timeout=10 + 30 * bool(self._links))
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill(why="was stopped")
            self._state.state = "dead"
        finally:
            self._lock.release()

    def state(self) -> EngineState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _spawn(self) -> None:
        """Start the child from the spawner thread (see the module's docstring) and its reader threads here."""
        _spawner.run(self._spawn_here)

    def _spawn_here(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, **self.env}
        # this process's ditto_fast first, before the working folder (which `python -m` would put first: a
        # checkout of another version there must not be what the engine runs)
        here = str(Path(ditto_fast.__file__).resolve().parents[1])
        self._inbox = queue.Queue()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, here, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, start_new_session=True)   # a group: its ffmpegs die with it
        except OSError as e:
            self._state.state, self._state.error = "dead", f"cannot start the engine process ({e.strerror or e})"
            raise InputError(f"{self.name}: {self._state.error}") from None
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._links = {}
        self._state.where, self._state.state, self._state.error = f"pid {self._proc.pid}", "starting", None
        self._state.sessions = []
        proc, conn, inbox, links = self._proc, self._conn, self._inbox, self._links
        threading.Thread(target=self._read, args=(proc, conn, inbox, links), name=f"ditto-fast-{self.name}-reader",
                         daemon=True).start()
        self._relays = {pid: t for pid, t in self._relays.items() if t.is_alive()}
        relay = self._relays[proc.pid] = threading.Thread(target=self._relay, args=(proc,), daemon=True,
                                                          name=f"ditto-fast-{self.name}-output")
        relay.start()
        threading.Thread(target=self._watch, args=(proc, links), name=f"ditto-fast-{self.name}-watchdog",
                         daemon=True).start()
        try:
            conn.send(m.Start(self.setup, self.limits.memory_bytes))
        except OSError:
            pass                                # gone already: _wait_ready says how it ended

    def _wait_ready(self) -> None:
        inbox, proc = self._inbox, self._proc
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
                self.info = message.info
                self._state.state, self._state.job = "idle", None
                return
            if isinstance(message, m.Failed):
                self._wait_exit()
                self._dead(message.line)
                raise EngineError(message.line, message.exit_code)
            if message is _EOF:
                self._dead(f"its process ended while loading ({self._ended(proc)})")
                raise InputError(f"{self.name}: {self._state.error}")

    def _dead(self, why: str) -> None:
        self._state.state, self._state.error, self._state.job = "dead", why, None

    def _kill(self, stacks: bool = False, why: str | None = None) -> None:
        """Kill the child (`stacks`: first ask it to print where each thread is, for the log; `why`: what its live
        sessions are told)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if why is not None:
                self._why[proc.pid] = why
            if stacks and proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            _kill_group(proc)
            _reap(proc)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _wait_exit(self, proc: subprocess.Popen | None = None, timeout: float = 5.0) -> None:
        """Wait a moment for the child (`proc`, else the current one) to end by itself, then kill it."""
        proc = proc or self._proc
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                _reap(proc)

    def _ended(self, proc: subprocess.Popen | None = None) -> str:
        """How the child (`proc`, else the current one) ended, with its last words if it printed any."""
        proc = proc or self._proc
        self._wait_exit(proc)
        words = signal_words(proc.returncode if proc else None)
        relay = self._relays.get(proc.pid) if proc else None
        if relay is not None:
            relay.join(2.0)                             # its last words read to their end
        frame = self._crashed_in.get(proc.pid) if proc else None
        if frame:                                       # a crash's own frame, not the end of its dump
            return one_line(f"{words} in {frame}", DEATH_CHARS - 50)
        said = " | ".join(self._said)
        return f"{words}; it last printed: {one_line(said, 300)}" if said else words

    # ------------------------------------------------------------------ the child's side of the socket
    def _read(self, proc: subprocess.Popen, conn: Connection, inbox: queue.Queue, links: dict[str, LiveLink]) -> None:
        """Every message the child sends: heartbeats kept, a live session's to its link, the rest queued for the
        render; EOF when it is gone (an idle engine that died is marked dead at once, its sessions told why)."""
        while True:
            try:
                message = conn.recv()
            except Exception:  # noqa: BLE001 - EOF, a broken socket, a message that does not unpickle: gone
                break
            if isinstance(message, m.Beat):
                self._state.last_beat = message.time
            elif isinstance(message, m.SessionMessage):
                link = links.get(message.id)
                if link is not None:
                    link.hear(message)
                    if not link.active:
                        self._forget(link, links)
            else:
                inbox.put(message)
        inbox.put(_EOF)
        why = self._why.pop(proc.pid, None)
        if why is None:
            why = f"died ({self._ended(proc)})"
        carried = len(links)
        for link in list(links.values()):
            link.lost(why)
            self._forget(link, links)
        if proc is self._proc and self._state.state == "idle" and not self._closing:
            doing = carrying(carried) if carried else "idle"
            self._state.last_death = why if why.startswith("hung") else f"died while {doing} ({why[6:-1]})"
            self._dead(self._state.last_death)

    def _forget(self, link: LiveLink, links: dict[str, LiveLink]) -> None:
        links.pop(link.id, None)
        if links is self._links:
            self._state.sessions = labels(links.values())

    def _watch(self, proc: subprocess.Popen, links: dict[str, LiveLink]) -> None:
        """While `proc` is this handle's engine: kill it when it stops beating and no render waits on it (a render's
        own wait does that), or when a live session of it makes no progress for the stall limit."""
        while proc is self._proc and proc.poll() is None and not self._closing:
            time.sleep(WATCH_S)
            if self._state.state != "idle" or proc is not self._proc:
                continue
            why = None
            beat = self._state.last_beat
            if beat is not None and time.time() - beat > self.limits.beat_s:
                why = f"stopped answering (no heartbeat for {self.limits.beat_s:g} s)"
            stalled = [k for k in links.values() if k.state == "streaming" and
                       time.monotonic() - k.last_change > self.limits.stall_s]
            if why is None and stalled:
                why = f"live session {stalled[0].order.label or stalled[0].id} made no progress for " \
                      f"{self.limits.stall_s:g} s"
            if why is None:
                continue
            cap = at_memory_cap(proc.pid)
            why = f"hung: {why}{f', at its memory cap of {cap:.2f} GiB (out of memory)' if cap else ''}; it was killed"
            with self._lock:
                if proc is not self._proc or self._state.state != "idle":
                    continue
                self._state.last_death = why
                self._dead(why)
                self._kill(stacks=True, why=why)
            return

    def _relay(self, proc: subprocess.Popen) -> None:
        """Pass on each line the child prints; keep its last ones, and the frame a crash's dump names first under
        "Current thread" (faulthandler's: the crashing one), not its list of modules."""
        in_dump = False
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.output(f"{self.name}: {line}")
                if line.startswith("Current thread "):
                    in_dump = True
                elif in_dump and line.lstrip().startswith("File "):
                    self._crashed_in[proc.pid] = line.strip()
                    in_dump = False
                if not line.startswith("Extension modules: "):
                    self._said.append(line)
        proc.stdout.close()

    def _next(self, inbox: queue.Queue, deadline: float | None, beat_since: float | None) -> Any:
        """The child's next message; None when `deadline` (monotonic) passes or the child stops beating."""
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
        """Render `job` in the child (see EngineHandle.render). A dead engine is restarted first."""
        if self._state.state == "dead" or self._proc is None:
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
        inbox = self._inbox
        started = time.monotonic()
        try:
            self._send(m.Render(job))
        except (OSError, ValueError):
            return self._died(job, "its process was gone when the job was sent")
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
                cap = at_memory_cap(self._proc.pid) if self._proc else None
                why += f", at its memory cap of {cap:.2f} GiB (out of memory)" if cap else ""
                why = f"hung: {why}; it was killed"
                self._kill(stacks=True, why=why)
                return self._died(job, why)
            if message is _EOF:
                why = self._why.get(self._proc.pid) if self._proc else None
                return self._died(job, why or f"its process died ({self._ended()})")
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
                self._wait_exit()
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
        if self._state.state == "dead" or self._proc is None:
            self.restart()
        with self._lock:
            link = LiveLink(order, self._send, self.name, heard)
            self._links[order.id] = link
            self._state.sessions = labels(self._links.values())
            try:
                self._send(m.Open(order.id, order))
            except (OSError, ValueError):
                pass                    # gone already: the read loop tells the link why
        return link



class _Spawner:
    """One thread, alive as long as this process, that starts every engine process (run(fn) runs fn there)."""

    def __init__(self) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ditto-fast-spawner", daemon=True)
                self._thread.start()
        done: queue.Queue = queue.Queue()
        self._calls.put((fn, done))
        error = done.get()
        if error is not None:
            raise error

    def _loop(self) -> None:
        while True:
            fn, done = self._calls.get()
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                done.put(e)
            else:
                done.put(None)


_spawner = _Spawner()


def _kill_group(proc: subprocess.Popen | None) -> None:
    """SIGKILL the engine process and everything in its process group (the ffmpeg processes it started)."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Wait for a killed child; one that does not end (stuck in the kernel: a hung driver, a dead mount) is left to
    a thread that reaps it whenever it does, so the caller goes on."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        threading.Thread(target=proc.wait, name="ditto-fast-reaper", daemon=True).start()
