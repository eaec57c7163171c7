"""An engine in a child process of this one (`child.py`): a render that segfaults, runs out of memory, is killed or
hangs takes only that process with it. The engine carries live sessions beside its renders, supervised alike; what
crosses the socket between them, and the limits a parent watches, are wire.py's (the same for a Ray actor). This
module gives the process's life: started, killed with its process group (its ffmpegs), its output passed on, and its
death said in words (its signal, the frame a crash's dump names, its last lines).

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
from ditto_fast.handles import messages as m
from ditto_fast.handles.base import EngineLimits, at_memory_cap, signal_words
from ditto_fast.handles.wire import DEATH_CHARS, WiredEngine

_CHILD = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from ditto_fast.handles.child import main; "
          "sys.exit(main(sys.argv[1:]))")


class ProcessEngine(WiredEngine):
    """A handle on one engine in a child process: started by start(), one render at a time, restarted on demand."""

    kind = "process"
    noun = "its process"

    def __init__(self, setup: Any, name: str = "engine-0", limits: EngineLimits = EngineLimits(),
                 env: dict[str, str] | None = None, output: Callable[[str], None] | None = None):
        """`setup`: the resolved RenderSetup the engine loads (the same bytes as an engine in this process);
        `env`: extra environment (CUDA_VISIBLE_DEVICES for one GPU of several); `output`: hears each line the
        child prints (stderr by default)."""
        super().__init__(name, limits)
        self.setup, self.env = setup, env or {}
        self.output = output or (lambda line: print(line, file=sys.stderr))
        self._said: deque[str] = deque(maxlen=5)        # the child's last lines, quoted when it dies
        self._crashed_in: dict[int, str] = {}           # pid -> the frame a crash's dump names (faulthandler's)
        self._relays: dict[int, threading.Thread] = {}  # pid -> the thread passing on what it prints

    @property
    def pid(self) -> int | None:
        proc = self._life
        return proc.pid if proc is not None and proc.poll() is None else None

    # ------------------------------------------------------------------ its life (wire.WiredEngine's hooks)
    def _launch(self) -> Connection:
        """Start the child from the spawner thread (see the module's docstring)."""
        ours: list[Connection] = []
        _spawner.run(lambda: ours.append(self._spawn_here()))
        return ours[0]

    def _spawn_here(self) -> Connection:
        ours, theirs = socket.socketpair()
        env = {**os.environ, **self.env}
        # this process's ditto_fast first, before the working folder (which `python -m` would put first: a
        # checkout of another version there must not be what the engine runs)
        here = str(Path(ditto_fast.__file__).resolve().parents[1])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, here, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, start_new_session=True)   # a group: its ffmpegs die with it
        except OSError as e:
            ours.close()
            self._state.state, self._state.error = "dead", f"cannot start the engine process ({e.strerror or e})"
            raise InputError(f"{self.name}: {self._state.error}") from None
        finally:
            theirs.close()
        self._life = proc
        self._state.where = f"pid {proc.pid}"
        self._relays = {pid: t for pid, t in self._relays.items() if t.is_alive()}
        relay = self._relays[proc.pid] = threading.Thread(target=self._relay, args=(proc,), daemon=True,
                                                          name=f"ditto-fast-{self.name}-output")
        relay.start()
        return Connection(ours.detach())

    def _start_message(self) -> m.Start:
        return m.Start(self.setup, self.limits.memory_bytes)

    def _end(self, proc: subprocess.Popen, stacks: bool) -> None:
        if stacks and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        _kill_group(proc)
        _reap(proc)

    def _memory_cap(self, proc: subprocess.Popen | None) -> float | None:
        return at_memory_cap(proc.pid) if proc is not None else None

    def _death(self, proc: subprocess.Popen) -> str:
        """How the child ended, with the frame its crash names or its last words if it printed any."""
        try:
            proc.wait(timeout=5.0)                      # it ends by itself, or is killed
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _reap(proc)
        words = signal_words(proc.returncode)
        relay = self._relays.get(proc.pid)
        if relay is not None:
            relay.join(2.0)                             # its last words read to their end
        frame = self._crashed_in.get(proc.pid)
        if frame:                                       # a crash's own frame, not the end of its dump
            return one_line(f"{words} in {frame}", DEATH_CHARS - 50)
        said = " | ".join(self._said)
        return f"{words}; it last printed: {one_line(said, 300)}" if said else words

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
