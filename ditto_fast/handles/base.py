"""What crosses an engine handle: a checked render job going out (`EngineJob`), its result or the reason it has none
coming back (a live session's own in live_link.py); the interface every handle has (`EngineHandle`) and what it
says of its engine (`EngineState`)."""

from __future__ import annotations

import signal
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ditto_fast.core.errors import DittoError

if TYPE_CHECKING:
    from ditto_fast.audio.decode import DecodedAudio
    from ditto_fast.engine.render_setup import RenderSetup
    from ditto_fast.engine.renderer import RenderResult
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.engine.stages import Progress
    from ditto_fast.handles.live_link import SessionOrder, LiveLink


# a render job's states, one set wherever a job is kept (a batch's report, serve's queue): queued, running, then
# done, skipped (done before: its output carries the same digest), failed or cancelled
JOB_STATES = ("queued", "running", "done", "skipped", "failed", "cancelled")


@dataclass(frozen=True)
class EngineJob:
    """A job checked by the parent: the request (paths absolute), its decoded audio and the signature of the avatar's
    files it was checked against (the engine opens the avatar from its own view of the store)."""

    request: RenderRequest
    audio: DecodedAudio
    label: str = ""                     # what the job is called where it came from (a serve job's id)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)      # names this render for a cancel


class JobCancelled(Exception):
    """Raised by a progress callback to stop its render (a cancelled job, a stopping server), and by a handle whose
    render so stopped: nothing is left at the output."""


class EngineDied(Exception):
    """The engine died or was killed under a job (`why` in words: a signal, out of memory, a hang); the parent lives
    on, and the job may run again on a fresh engine."""


class JobTimedOut(Exception):
    """A render ran past the job limit (EngineLimits.job_s) and its engine was stopped: the job's own length, not a
    crash of its engine: it is not run again."""

    def __init__(self, limit_s: float):
        super().__init__(f"it ran past its limit of {limit_s:g} s and was stopped")
        self.limit_s = limit_s


class EngineError(DittoError):
    """A DittoError a render ended with inside an engine: its one line and exit code, as `render` gives them."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class EngineLimits:
    """When the parent gives up on its engine: no heartbeat for `beat_s` (hung with the interpreter held), no
    progress within a job for `stall_s`, a job past `job_s` (None: no limit), loading past `start_s`; and the cap on
    the engine process's address space (`memory_bytes`, None: none)."""

    beat_s: float = 60.0
    stall_s: float = 900.0
    job_s: float | None = None
    start_s: float = 900.0
    memory_bytes: int | None = None


def carrying(n: int) -> str:
    """What an engine carrying `n` live sessions does, in words (its health, its death's cause)."""
    return f"carrying {n} live session{'s' if n != 1 else ''}"


@dataclass
class EngineState:
    """What a handle says of its engine (for /healthz, the log and the report)."""

    name: str
    kind: str                           # process or ray
    state: str = "starting"             # starting, idle, busy (a job), restarting or dead
    where: str = ""                     # pid N on this host, or a Ray node
    job: str | None = None              # the job it renders (busy)
    sessions: list[str] = field(default_factory=list)      # the live sessions it carries (beside any job)
    last_beat: float | None = None      # when the engine last said it is alive (time.time())
    restarts: int = 0
    last_death: str | None = None       # why its previous engine died
    error: str | None = None            # why it cannot render (dead)

    def as_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["heartbeat_age_s"] = None if self.last_beat is None else round(time.time() - self.last_beat, 1)
        return body


class EngineHandle(Protocol):
    """An engine running elsewhere, loaded once, rendering one job at a time."""

    name: str
    setup: RenderSetup | None           # what its outputs' digests are made with (known once started)
    info: dict[str, Any]                # what the engine said when it started (a Ray actor: node, node_id, threads)

    def start(self) -> None:
        """Start the engine and load its networks; DittoError if it cannot render."""

    def render(self, job: EngineJob, progress: Progress | None = None,
               commit: Callable[[], None] | None = None) -> RenderResult:
        """Render `job`; `progress(stage, done, total)` hears it and may raise JobCancelled to stop it, as may
        `commit()`, called once the output is complete, just before its rename (after it, the job is done). Raises
        EngineError (the render's own refusal), JobCancelled, EngineDied or JobTimedOut (then call restart())."""

    def open_live(self, order: SessionOrder, heard: Callable[[str, Any], None] | None = None) -> LiveLink:
        """Start the live session `order` on this engine, beside any job it renders; its link (`heard(event, detail)`
        hears ready, log, event, ended and failed)."""

    def restart(self) -> None:
        """A fresh engine for one that died (counted in the state's restarts); DittoError if none can start."""

    def state(self) -> EngineState:
        """What the engine is doing now."""

    def close(self) -> None:
        """Stop the engine (a render under way is abandoned: nothing is left at its output)."""


def signal_words(returncode: int | None) -> str:
    """How a process ended, in words: 'SIGSEGV', 'SIGKILL (out of memory, or killed)', 'exit 3'."""
    if returncode is None:
        return "still running"
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    hint = {"SIGKILL": " (out of memory, or killed by an operator)",
            "SIGBUS": " (a file it had mapped was cut short: an avatar copied over in place?)"}.get(name, "")
    return name + hint


def at_memory_cap(pid: int) -> float | None:
    """The address-space cap (GiB) process `pid` holds within 64 MiB of, or None (no cap, or well under it): native
    code that cannot allocate fails in many words, or hangs."""
    import resource

    try:
        cap = resource.prlimit(pid, resource.RLIMIT_AS)[0]
        with open(f"/proc/{pid}/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    if cap == resource.RLIM_INFINITY or size < cap - (64 << 20):
        return None
    return cap / (1 << 30)
