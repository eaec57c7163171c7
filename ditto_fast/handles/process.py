"""An engine in a child process of this one (`child.py`): a render that segfaults, runs out of memory, is killed or
hangs takes only that process with it. The parent reads everything the child says on one thread (heartbeats,
progress, outcomes), so it sees the child die even while idle, and kills a child that stops beating or makes no
progress for too long."""

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
from ditto_fast.core.errors import DittoError, InputError, one_line
from ditto_fast.media.claims import remove_dead_writers
from ditto_fast.handles.base import (EngineDied, EngineError, EngineJob, EngineLimits, EngineState, JobCancelled,
                                     at_memory_cap, signal_words)

_EOF = ("eof",)
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
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._said: deque[str] = deque(maxlen=5)        # the child's last lines, quoted when it dies
        self._lock = threading.Lock()
        self._closing = False

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the child (unless launch() did) and wait until its networks are loaded; DittoError (its line and
        exit code) if it cannot render."""
        with self._lock:
            if self._proc is None:
                self._spawn()
            self._wait_ready()

    def launch(self) -> None:
        """Start the child without waiting for it (start() then waits). The child dies with the thread that starts
        it (Linux's parent-death signal follows the thread): launch from a thread that lives as long as the
        engine should, then wait for it from any."""
        with self._lock:
            if self._proc is None:
                self._spawn()

    def restart(self) -> None:
        """Kill what is left of the engine and start a fresh one (counted in restarts)."""
        with self._lock:
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
                try:
                    self._conn.send(("stop",))
                    self._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()
            self._state.state = "dead"
        finally:
            self._lock.release()

    def state(self) -> EngineState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _spawn(self) -> None:
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
        self._state.where, self._state.state, self._state.error = f"pid {self._proc.pid}", "starting", None
        proc, conn, inbox = self._proc, self._conn, self._inbox
        threading.Thread(target=self._read, args=(proc, conn, inbox), name=f"ditto-fast-{self.name}-reader",
                         daemon=True).start()
        threading.Thread(target=self._relay, args=(proc,), name=f"ditto-fast-{self.name}-output",
                         daemon=True).start()
        try:
            conn.send(("start", self.setup, self.limits.memory_bytes))
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
            if message[0] == "ready":
                self._state.state, self._state.job = "idle", None
                return
            if message[0] == "failed":
                self._wait_exit()
                self._dead(message[1])
                raise EngineError(message[1], message[2])
            if message == _EOF:
                self._dead(f"its process ended while loading ({self._ended(proc)})")
                raise InputError(f"{self.name}: {self._state.error}")

    def _dead(self, why: str) -> None:
        self._state.state, self._state.error, self._state.job = "dead", why, None

    def _kill(self, stacks: bool = False) -> None:
        """Kill the child (`stacks`: first ask it to print where each thread is, for the log)."""
        proc, self._proc = self._proc, None
        if proc is not None:
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
        said = " | ".join(self._said)
        return f"{words}; it last printed: {one_line(said, 300)}" if said else words

    # ------------------------------------------------------------------ the child's side of the socket
    def _read(self, proc: subprocess.Popen, conn: Connection, inbox: queue.Queue) -> None:
        """Every message the child sends: heartbeats kept, the rest queued for the render; EOF when it is gone
        (an idle engine that died is marked dead at once)."""
        while True:
            try:
                message = conn.recv()
            except Exception:  # noqa: BLE001 - EOF, a broken socket, a message that does not unpickle: gone
                break
            if message[0] == "beat":
                self._state.last_beat = message[1]
            else:
                inbox.put(message)
        inbox.put(_EOF)
        if proc is self._proc and self._state.state == "idle" and not self._closing:
            why = f"died while idle ({self._ended(proc)})"
            if proc is self._proc and self._state.state == "idle":     # not replaced meanwhile
                self._state.last_death = why
                self._dead(why)

    def _relay(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._said.append(line)
                self.output(f"{self.name}: {line}")
        proc.stdout.close()

    def _next(self, inbox: queue.Queue, deadline: float | None, beat_since: float | None) -> tuple | None:
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
        except (EngineDied, JobCancelled, EngineError):
            raise
        except BaseException:       # an interrupt, or this process's own trouble: the engine is let go at once
            self._kill()
            self._dead("let go in the middle of a job")
            remove_dead_writers(job.request.output)
            raise

    def _render(self, job: EngineJob, progress: Callable[[str, int, int], None] | None,
                commit: Callable[[], None] | None) -> Any:
        conn, inbox = self._conn, self._inbox
        started = time.monotonic()
        try:
            conn.send(("render", job))
        except OSError:
            return self._died(job, "its process was gone when the job was sent")
        last_progress, cancelled, token = started, False, job.token
        while True:
            deadline = min(last_progress + self.limits.stall_s,
                           started + self.limits.job_s if self.limits.job_s else float("inf"))
            message = self._next(inbox, deadline, time.time())
            if message is None:
                now = time.monotonic()
                why = f"ran past its limit of {self.limits.job_s:g} s" if self.limits.job_s and \
                    now >= started + self.limits.job_s else f"made no progress for {self.limits.stall_s:g} s" if \
                    now >= last_progress + self.limits.stall_s else \
                    f"stopped answering (no heartbeat for {self.limits.beat_s:g} s)"
                cap = at_memory_cap(self._proc.pid) if self._proc else None
                why += f", at its memory cap of {cap:.2f} GiB (out of memory)" if cap else ""
                self._kill(stacks=True)
                return self._died(job, f"hung: {why}; it was killed")
            kind = message[0]
            if message == _EOF:
                return self._died(job, f"its process died ({self._ended()})")
            if len(message) > 1 and message[1] != token:
                continue                                # a late word about an earlier job
            if kind == "commit":                        # complete: renamed into place unless cancelled now
                try:
                    if cancelled:
                        raise JobCancelled()
                    if commit is not None:
                        commit()
                    self._send_quietly(("go", token))
                except JobCancelled:
                    cancelled = True
                    self._send_quietly(("cancel", token))
                continue
            if kind == "progress":
                last_progress = time.monotonic()
                if progress is not None and not cancelled:
                    try:
                        progress(*message[2:])
                    except JobCancelled:                # passed on: the engine stops at its next frame batch
                        cancelled = True
                        self._send_quietly(("cancel", token))
                continue
            self._state.state, self._state.job = "idle", None
            if kind == "done":
                return message[2]
            if kind == "cancelled":
                raise JobCancelled()
            if kind == "error":
                raise EngineError(message[2], message[3])
            if kind == "fatal":
                self._wait_exit()
                return self._died(job, message[2])

    def _send_quietly(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except (OSError, AttributeError):
            pass                                        # gone: the read loop sees it

    def _died(self, job: EngineJob, why: str) -> Any:
        self._state.last_death = why
        self._dead(why)
        self._kill()
        remove_dead_writers(job.request.output)
        raise EngineDied(f"{self.name} {why}")



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
