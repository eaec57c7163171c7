"""One job driver for every place render jobs are kept (a batch's book, serve's queue): a loop per engine handle that
takes the next job, checks it, skips one made before, renders it on the handle, retries it on a fresh engine when
its engine dies under it, and records what became of it, all through a small store (`JobStore`); one retry rule
(`RetryPolicy`) wherever jobs are kept."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Protocol, TypeVar

from ditto_fast.core.errors import EXIT_INTERNAL, InputError, DittoError, one_line
from ditto_fast.handles.base import EngineDied, EngineHandle, EngineJob, JobCancelled, JobTimedOut
from ditto_fast.handles.outcome import internal_error

if TYPE_CHECKING:
    from ditto_fast.engine.clip import Clip
    from ditto_fast.engine.render_setup import RenderSetup
    from ditto_fast.engine.renderer import RenderResult
    from ditto_fast.engine.stages import Progress

J = TypeVar("J")
TIMED_OUT_EXIT = InputError.exit_code      # a job past its time limit: too long for this engine, as a file too large


@dataclass(frozen=True)
class RetryPolicy:
    """What happens when an engine dies under a job: the job runs again on a fresh engine until it has killed
    `max_deaths` engines, then it fails naming every cause (a job past its time limit fails at once: its own
    length, not a crash). The dead engine is started again before its handle's next job, after the pauses of
    `restart_pauses_s` (the last repeats), at most `restart_tries` times in a row (None: until it starts); then
    that handle takes no more jobs."""

    max_deaths: int = 2
    restart_pauses_s: tuple[float, ...] = (0.0, 5.0, 30.0)
    restart_tries: int | None = 3

    def again(self, deaths: int) -> bool:
        """Whether a job whose engine died under it `deaths` times runs again."""
        return deaths < self.max_deaths

    def gave_up(self, causes: list[str]) -> str:
        """The one line of a job failed for killing its engine each time (`causes`: each death's)."""
        return one_line(f"killed its engine {len(causes)} times ({', '.join(causes)}); render it alone with "
                        "`ditto-fast render` to see why")

    def pause(self, tries: int) -> float | None:
        """The pause before try `tries` + 1 to start a dead engine again; None: no more tries."""
        if self.restart_tries is not None and tries >= self.restart_tries:
            return None
        return self.restart_pauses_s[min(tries, len(self.restart_pauses_s) - 1)]


class Rendering(NamedTuple):
    """A job as it goes to its engine: what it is called there, what hears its progress, what is called once its
    output is complete (each callback may raise JobCancelled)."""

    label: str
    progress: Progress | None = None
    commit: Callable[[], None] | None = None


def timed_out(e: JobTimedOut) -> str:
    """The one line of a job stopped at its time limit (serve's --job-timeout)."""
    return (f"ran past --job-timeout ({e.limit_s:g} s) and was stopped; it is not run again: give it shorter audio, "
            "or start serve with a longer --job-timeout (`ditto-fast render` shows how long it takes)")


class JobStore(Protocol[J]):
    """Where jobs are kept and what became of each is recorded (batch's executor over its book, serve's dispatcher
    over its queue); the driver calls it from one thread per handle."""

    def take(self, handle: EngineHandle) -> Optional[J]:
        """The next job for `handle`, marked running; None: none now."""

    def idle(self, handle: EngineHandle) -> bool:
        """None was there for `handle`: wait for one (True: ask again), or say there will be none (False)."""

    def put_back(self, job: J) -> None:
        """The job goes back unrun (its engine could not start, or the store stops under it)."""

    def check(self, job: J) -> Clip:
        """The job checked as it starts; DittoError: it fails with that line."""

    def skip(self, job: J, clip: Clip, setup: RenderSetup) -> bool:
        """Whether the job's output was made before by `setup` (its digest); if so, the job is recorded so."""

    def watch(self, job: J, handle: EngineHandle) -> Rendering:
        """The job goes to `handle` now: its label and callbacks there."""

    def preview(self, job: J, result: RenderResult, clip: Clip) -> None:
        """A rendered job's preview PNG, when one is asked for (a failure is noted; the job stands)."""

    def done(self, job: J, result: RenderResult, seconds: float) -> None:
        """A rendered job, recorded done."""

    def failed(self, job: J, error: str | DittoError, exit_code: int, seconds: float) -> None:
        """A job that ended failed, with its one line."""

    def cancelled(self, job: J, seconds: float) -> None:
        """A render stopped by a progress or commit callback: recorded cancelled (or put back, the store stopping)."""

    def died(self, job: J, cause: str, policy: RetryPolicy) -> None:
        """The job's engine died under it (`cause`): counted, then queued again for the next free engine while
        `policy` allows, else ended (failed with `policy.gave_up`, or cancelled if a cancel was asked)."""

    def let_go(self, job: J) -> None:
        """The driver is done with the job, whatever became of it."""

    def lost(self, job: J, error: Exception) -> None:
        """The job's outcome could not be recorded (`error`, raised by the store itself): raise it, or put the job
        back."""

    def engine(self, handle: EngineHandle, error: Exception | None, restarted: bool,
               next_try_s: float | None) -> None:
        """A try to start (`restarted`: again, after a death) `handle`'s engine: it runs (`error` None), or why not
        and when it is tried again (`next_try_s`; None: never, the handle takes no more jobs)."""


def drive(handle: EngineHandle, store: JobStore[Any], policy: RetryPolicy, stop: threading.Event, *,
          start: bool = False) -> None:
    """Render the store's jobs on `handle` until it has none for it, `stop` is set, or the handle's engine cannot be
    started; `start`: the engine is started here, for the first job taken (else it runs already)."""
    started, tries = not start, 0
    while not stop.is_set():
        if started and handle.state().state == "dead":
            pause = policy.pause(tries)
            if pause is None or (pause and stop.wait(pause)):
                return
            error = _start(handle.restart)
            tries = 0 if error is None else tries + 1
            store.engine(handle, error, True, None if error is None else policy.pause(tries))
            continue
        job = store.take(handle)
        if job is None:
            if store.idle(handle):
                continue
            return
        if not started:         # a job to render: the engine starts, the job back meanwhile for whichever is ready
            store.put_back(job)
            error = _start(handle.start)
            store.engine(handle, error, False, None)
            if error is not None:
                return
            started = True
            continue
        try:
            _one(handle, store, policy, stop, job)
        except Exception as e:  # noqa: BLE001 - the store's own trouble (its database locked, say): the store says
            store.lost(job, e)
        finally:
            store.let_go(job)


def _start(start: Callable[[], None]) -> Exception | None:
    """Start an engine; why it could not (a DittoError, or Ray's own), or None."""
    try:
        start()
    except Exception as e:  # noqa: BLE001 - the store says it; this handle takes no job meanwhile
        return e
    return None


def _one(handle: EngineHandle, store: JobStore[Any], policy: RetryPolicy, stop: threading.Event, job: Any) -> None:
    """Check, skip or render one job on `handle`, and record its outcome (what the store raises in recording it is
    its own trouble, not the job's)."""
    t0 = time.perf_counter()

    def seconds() -> float:
        return round(time.perf_counter() - t0, 3)
    try:
        clip = store.check(job)
        if store.skip(job, clip, handle.setup):
            return
        label, progress, commit = store.watch(job, handle)
        result = handle.render(EngineJob(clip.request, clip.audio, label=label), progress=progress, commit=commit)
        store.preview(job, result, clip)
    except JobCancelled:
        store.cancelled(job, seconds())
        return
    except EngineDied as e:
        if stop.is_set():                   # its engine was let go: not the job's doing
            store.put_back(job)
        else:
            store.died(job, str(e), policy)
        return
    except JobTimedOut as e:                # the job's length: failed once, no death counted, not run again
        store.failed(job, timed_out(e), TIMED_OUT_EXIT, seconds())
        return
    except DittoError as e:
        store.failed(job, e, e.exit_code, seconds())
        return
    except Exception as e:  # noqa: BLE001 - one job's bug must not stop the others
        store.failed(job, internal_error(e), EXIT_INTERNAL, seconds())
        return
    store.done(job, result, seconds())
