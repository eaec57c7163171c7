"""The server's dispatch threads, one per engine handle (an engine process here, or a Ray actor), each the job
driver (handles/driver.py) over the queue, for which the dispatcher is the job store: each takes the next job from
the queue, checks it again as `render` would (the files may have changed since it was accepted), and has its engine
render it (the same request, checks and bytes as `render`); a request identical to a finished one (its output
carries the same digest) is done at once. An engine that dies under a job is replaced and the job retried or failed
by the driver's rule (--max-crashes; a dead engine tried again at once, after 5, 30, then every 120 s); a thread
outlives any one job and any passing error of the queue's database."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ditto_fast.engine.digest import clip_is_finished
from ditto_fast.core.errors import DittoError, one_line
from ditto_fast.engine.clip import Clip, check_clip
from ditto_fast.engine.open_avatars import OpenAvatars
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles.base import EngineHandle, JobCancelled
from ditto_fast.handles.driver import Rendering, RetryPolicy, drive
from ditto_fast.serve.decoded import MAX_SPEECH_S, DecodedMemo
from ditto_fast.serve.jobs.callbacks import CallbackSender
from ditto_fast.serve.jobs.queue import CANCELLED_RUNNING, JobQueue
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.options import MAX_CRASHES

PROGRESS_EVERY_S = 0.5          # the queue's progress of a running job is at most this old
RESTART_PAUSES_S = (0.0, 5.0, 30.0, 120.0)      # between tries to start a dead engine again (the last repeats)
HOLD_POLL_S = 0.25              # how often a held dispatch thread looks whether the live sessions ended
DB_RETRY_S = 2.0                # after the queue's database could not be read or written


def request_of(job: dict) -> RenderRequest:
    """The RenderRequest a queued job holds (checked when it was accepted; paths absolute)."""
    return RenderRequest.from_json(job["request"], Path("/"), f"job {job['id']}")


class Dispatcher:
    """Renders queued jobs on engine handles, one job at a time on each, each handle with its own dispatch thread;
    the queue gives each free engine the next job by priority. `avatars` opens the avatars jobs are checked
    against (shared with the acceptor); `setup`, what they are checked with."""

    def __init__(self, handles: Sequence[EngineHandle], queue: JobQueue, metrics: Metrics,
                 log: Callable[[dict], None], avatars: OpenAvatars, setup: RenderSetup,
                 audio: DecodedMemo | None = None, callbacks: CallbackSender | None = None,
                 max_crashes: int = MAX_CRASHES, at_start: Callable[[dict, RenderRequest], None] | None = None,
                 hold: Callable[[], bool] | None = None, previews: Path | None = None):
        """`callbacks` sends the final states the queue's outbox holds; a job whose engine died under it
        `max_crashes` times is failed; `at_start(job, request)` checks a job again as it starts (its paths within
        the roots, a watch folder's file unchanged: Acceptor.at_start); while `hold()` is true (a live session
        streams), no job starts; `previews`: a folder each rendered job's preview PNG is drawn into (<job id>.png)
        before it is marked done."""
        self.handles, self.queue, self.metrics, self.log = list(handles), queue, metrics, log
        self.avatars, self.setup, self.audio = avatars, setup, audio
        self.callbacks, self.at_start, self.hold = callbacks, at_start, hold
        self.previews = previews
        self.policy = RetryPolicy(max_deaths=max_crashes, restart_pauses_s=RESTART_PAUSES_S, restart_tries=None)
        self._queued = threading.Condition()       # guards what follows, read by the HTTP threads too
        self._notified = 0                          # how many times a job was queued (a thread that found none
        #                                             waits for this to change)
        self._seen: dict[str, int] = {}             # engine -> _notified when it last looked for a job
        self._stop = threading.Event()
        self._cancel: set[str] = set()
        self._committed: set[str] = set()          # running jobs whose output is complete: too late to cancel
        self._running: dict[str, str] = {}          # job -> the engine it was given to
        metrics.engine_states = lambda: [h.state().as_json() for h in self.handles]
        self._threads = [threading.Thread(target=self._drive, args=(h,), name=f"ditto-fast-dispatch-{i}", daemon=True)
                         for i, h in enumerate(self.handles)]

    @property
    def running(self) -> list[str]:
        """The jobs being rendered now."""
        with self._queued:
            return sorted(self._running)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def notify(self) -> None:
        """A job was queued: a free engine takes it now."""
        with self._queued:
            self._notified += 1
            self._queued.notify_all()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after each running job's next frame batch (those jobs are queued again) and wait for the threads."""
        self._stop.set()
        self.notify()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    def cancel(self, job_id: str) -> bool:
        """Stop the running job `job_id` before its output is renamed into place (it ends cancelled); False when too
        late: its output is complete and being renamed into place, or it has ended."""
        with self._queued:
            if job_id in self._committed or job_id not in self._running:
                return False
            self._cancel.add(job_id)
            return True

    def health(self) -> dict:
        """Each engine's state and whether its dispatch thread runs; `ok` when at least one engine can render."""
        engines = []
        for handle, thread in zip(self.handles, self._threads):
            state = handle.state().as_json()
            state["dispatching"] = thread.is_alive()
            engines.append(state)
        ok = any(e["dispatching"] and e["state"] in ("idle", "busy") for e in engines)
        return {"ok": ok, "engines": engines}

    def _drive(self, handle: EngineHandle) -> None:
        """A dispatch thread: the job driver on `handle` until the server stops."""
        drive(handle, self, self.policy, self._stop)

    # ------------------------------------------------------------------ the queue as the driver's job store
    def take(self, handle: EngineHandle) -> dict | None:
        if self.hold is not None and self.hold():   # a live session streams: no job starts
            return None
        try:
            with self._queued:
                self._seen[handle.name] = self._notified
            job = self.queue.take()
        except sqlite3.Error as e:                  # locked by a backup, say: try again shortly
            self.log({"event": "queue unavailable", "engine": handle.name,
                      "error": one_line(f"the job queue could not be read ({e}); trying again", 300)})
            self._stop.wait(DB_RETRY_S)
            return None
        if job is None:
            return None
        with self._queued:
            self._running[job["id"]] = handle.name
        self.log({"job": job["id"], "state": "running", "attempt": job["attempts"], "engine": handle.name})
        return job

    def idle(self, handle: EngineHandle) -> bool:
        if self.hold is not None and self.hold():
            self._stop.wait(HOLD_POLL_S)
        else:
            with self._queued:
                self._queued.wait_for(lambda: self._notified != self._seen.get(handle.name) or self._stop.is_set(),
                                      timeout=1.0)
        return True                                 # a server waits for jobs until it stops

    def put_back(self, job: dict) -> None:
        self.queue.requeue(job["id"])               # the server stops: run it next time
        self.log({"job": job["id"], "state": "queued", "why": "server stopping"})

    def check(self, job: dict) -> Clip:
        """The job checked again as it starts: its files as they are now (the audio decoded at acceptance is used
        only if the file is unchanged since)."""
        request = request_of(job)
        if self.at_start is not None:
            self.at_start(job, request)
        audio = self.audio.take(request.audio) if self.audio else None
        return check_clip(request, self.avatars.get(request.avatar), self.setup.config, audio=audio,
                          max_seconds=self.audio.longest if self.audio else MAX_SPEECH_S,
                          **({"decode": self.audio.patient} if self.audio else {}))    # in turn, waiting for it

    def skip(self, job: dict, clip: Clip, setup: RenderSetup) -> bool:
        if not clip_is_finished(clip, setup):
            return False
        self._ended(job["id"], self.queue.finish(job["id"], "done", output=str(clip.output), seconds=0.0,
                                                 skipped=1, exit_code=0))
        return True

    def watch(self, job: dict, handle: EngineHandle) -> Rendering:
        return Rendering(job["id"], self._progress(job["id"]), self._commit(job["id"]))

    def preview(self, job: dict, result: RenderResult, clip: Clip) -> None:
        """Draw a rendered job's preview PNG (render --preview's) into the previews folder; a failure is logged, the
        job stays done."""
        if self.previews is None:
            return
        try:
            from ditto_fast.engine.single import write_preview

            self.previews.mkdir(parents=True, exist_ok=True)
            write_preview(self.previews / f"{job['id']}.png", result, clip)
        except Exception as e:  # noqa: BLE001 - a preview is a courtesy: the render stands
            self.log({"job": job["id"], "event": "preview failed", "error": one_line(f"{type(e).__name__}: {e}", 300)})

    def done(self, job: dict, result: RenderResult, seconds: float) -> None:
        done = self.queue.finish(job["id"], "done", output=str(result.output), exit_code=0, seconds=seconds,
                                 timings=result.timings)
        self.metrics.rendered(result.timings)
        self._ended(job["id"], done)

    def failed(self, job: dict, error: str | DittoError, exit_code: int, seconds: float) -> None:
        self._ended(job["id"], self.queue.finish(job["id"], "failed", error=str(error), exit_code=exit_code,
                                                 seconds=seconds))

    def cancelled(self, job: dict, seconds: float) -> None:
        if self._stop.is_set() and not self._cancel_asked(job["id"]):     # the server stops: not the job's cancel
            self.put_back(job)
        else:
            self._ended(job["id"], self.queue.finish(job["id"], "cancelled", error=CANCELLED_RUNNING,
                                                     seconds=seconds))

    def died(self, job: dict, cause: str, policy: RetryPolicy) -> None:
        self.log({"event": "engine died", "engine": self._engine_of(job), "job": job["id"], "error": cause})
        done = self.queue.engine_died(job["id"], cause, policy.max_deaths)
        if done is not None:
            self.metrics.crashed(done)
        if done is not None and done["status"] == "queued":     # on the next free engine
            self.log({"job": job["id"], "state": "queued", "why": cause})
            return
        self._ended(job["id"], done)

    def let_go(self, job: dict) -> None:
        with self._queued:
            self._running.pop(job["id"], None)
            self._cancel.discard(job["id"])
            self._committed.discard(job["id"])

    def lost(self, job: dict, error: Exception) -> None:
        """The thread outlives any one job's trouble (the queue's database locked past its timeout, say): the job is
        queued again, tried until it is (or the server stops: then the next start does it, its lease being dead)."""
        self.log({"job": job["id"], "engine": self._engine_of(job), "error": one_line(
            f"dispatch failed: {type(error).__name__}: {error}; the job is queued again", 500)})
        self._stop.wait(DB_RETRY_S)
        while not self._stop.is_set():
            try:
                self.queue.requeue(job["id"])
                return
            except Exception as e:  # noqa: BLE001 - the database still locked: again shortly
                self.log({"job": job["id"], "error": one_line(f"could not queue it again ({e}); trying again", 300)})
                self._stop.wait(DB_RETRY_S)

    def engine(self, handle: EngineHandle, error: Exception | None, restarted: bool,
               next_try_s: float | None) -> None:
        if error is not None:                       # a server's engines are tried again until it stops
            self.log({"event": "engine down", "engine": handle.name, "error": one_line(
                f"it could not start again ({error}); next try in {next_try_s or 0:g} s", 600)})
            return
        self.metrics.engine_restarted(handle.name)
        self.log({"event": "engine started", "engine": handle.name, "where": handle.state().where,
                  "restarts": handle.state().restarts})

    def _engine_of(self, job: dict) -> str | None:
        with self._queued:
            return self._running.get(job["id"])

    def _cancel_asked(self, job_id: str) -> bool:
        """Whether a cancel of the running job was asked (by this server's API, or written in the queue)."""
        with self._queued:
            asked = job_id in self._cancel
        return asked or self.queue.cancel_requested(job_id)

    def _progress(self, job_id: str) -> Callable[[str, int, int], None]:
        last = [0.0]

        def tick(stage: str, done: int, total: int) -> None:
            if self._stop.is_set() or self._cancel_asked(job_id):
                raise JobCancelled()
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done == total:
                last[0] = now
                self.queue.set_progress(job_id, {"stage": stage, "done": done, "total": total})
        return tick

    def _commit(self, job_id: str) -> Callable[[], None]:
        """Called when the job's output is complete: JobCancelled if it was cancelled; from now on, it is done."""
        def commit() -> None:
            with self._queued:
                if self._cancel_asked(job_id):
                    raise JobCancelled()
                self._committed.add(job_id)
        return commit

    def _ended(self, job_id: str, done: dict | None) -> None:
        """The job `job_id` this server ran reached its final state `done` (None: its lease on it is gone, nothing
        was written)."""
        if done is None:                    # no longer this server's (never the case with one server per home)
            self.log({"job": job_id, "error": "the job's final state was not written: this server's lease on it is "
                      "gone"})
            return
        self.ended(done)

    def ended(self, job: dict) -> None:
        """A job reached its final state: metrics, the log line and its callback (from the queue's outbox)."""
        self.metrics.ended(job)
        self.log({"job": job["id"], "state": job["status"], "seconds": job["seconds"], "output": job["output"],
                  "error": job["error"], "exit_code": job["exit_code"],
                  **({"skipped": True} if job["skipped"] else {})})
        if job["callback"] and self.callbacks:
            self.callbacks.wake()
