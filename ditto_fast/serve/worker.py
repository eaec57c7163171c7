"""The server's render threads, one per warm engine (one in process; one per Ray actor with --ray): each takes the
next job from the queue and renders it exactly as `render` would (the same request, checks and bytes); a request
identical to a finished one (its output carries the same digest) is done at once. Progress goes to the queue; a
cancelled job stops at its next frame batch."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

from ditto_fast.avatar import Avatar
from ditto_fast.batch.jobs import clip_is_finished
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, one_line
from ditto_fast.engine.clip import Clip, check_clip
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.stages import Progress
from ditto_fast.serve.accept import DecodedMemo
from ditto_fast.serve.callbacks import post_job
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.queue import JobQueue, job_view

PROGRESS_EVERY_S = 0.5          # the queue's progress of a running job is at most this old
MAX_ATTEMPTS = 2                # a job whose engine died under it runs once more, on another


class JobCancelled(Exception):
    """Raised inside a render whose job was cancelled (or whose server is stopping): the render's own clean-up
    leaves nothing at its output."""


def request_of(job: dict) -> RenderRequest:
    """The RenderRequest a queued job holds (checked when it was accepted; paths absolute)."""
    return RenderRequest.from_json(job["request"], Path("/"), f"job {job['id']}")


class Engine(Protocol):
    """What renders a job: the in-process `Renderer`, or a Ray actor's engine (serve/ray_pool.py)."""

    setup: RenderSetup                  # what its outputs' digests are made with

    def avatar(self, name: str) -> Avatar: ...

    def render(self, clip: Clip, progress: Progress | None = None) -> RenderResult: ...


class LostEngine(Exception):
    """The engine died under a job (a Ray actor lost with its node, say); the job may run again on another."""


class Worker:
    """Renders queued jobs, one at a time on each of its engines (one in process, or one per Ray actor), each engine
    in its own thread and loaded once; the queue gives each free engine the next job by priority."""

    def __init__(self, engines: Sequence[Engine], queue: JobQueue, metrics: Metrics, log: Callable[[dict], None],
                 audio: DecodedMemo | None = None, at_start: Callable[[dict, RenderRequest], None] | None = None):
        self.engines, self.queue, self.metrics, self.log, self.audio = list(engines), queue, metrics, log, audio
        self.at_start = at_start                    # the acceptor's checks as a job starts (Acceptor.at_start)
        self._queued = threading.Condition()
        self._notified = 0                          # how many times a job was queued (a thread that found none
        #                                             waits for this to change)
        self._stop = threading.Event()
        self._cancel: set[str] = set()
        self._running: dict[int, str] = {}          # engine index -> the job it renders
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"ditto-fast-render-{i}", daemon=True)
                         for i in range(len(self.engines))]

    @property
    def running(self) -> list[str]:
        """The jobs being rendered now."""
        return sorted(self._running.values())

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

    def cancel(self, job_id: str) -> None:
        """Stop the running job `job_id` at its next frame batch (it ends cancelled)."""
        self._cancel.add(job_id)

    def _loop(self, index: int) -> None:
        while not self._stop.is_set():
            if getattr(self.engines[index], "lost", False):     # a Ray actor that died and could not restart
                self.log({"event": "engine lost", "engine": index, "error": "its Ray actor died and no new one "
                          "started; the other engines go on (restart the server to try again)"})
                return
            seen = self._notified
            job = self.queue.take()
            if job is None:
                with self._queued:
                    self._queued.wait_for(lambda: self._notified != seen or self._stop.is_set(), timeout=1.0)
                continue
            self._running[index] = job["id"]
            try:
                self._run(job, self.engines[index])
            finally:
                del self._running[index]
                self._cancel.discard(job["id"])

    def _progress(self, job_id: str) -> Callable[[str, int, int], None]:
        last = [0.0]

        def tick(stage: str, done: int, total: int) -> None:
            if job_id in self._cancel or self._stop.is_set():
                raise JobCancelled()
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done == total:
                last[0] = now
                self.queue.set_progress(job_id, {"stage": stage, "done": done, "total": total})
        return tick

    def _run(self, job: dict, engine: Engine) -> None:
        t0 = time.perf_counter()
        self.log({"job": job["id"], "state": "running", "attempt": job["attempts"]})
        try:
            request = request_of(job)
            if self.at_start:
                self.at_start(job, request)
            audio = self.audio.take(request.audio) if self.audio else None
            clip = check_clip(request, engine.avatar(request.avatar), engine.setup.config, audio=audio)
            if clip_is_finished(clip, engine.setup):
                done = self.queue.finish(job["id"], "done", output=str(clip.output), seconds=0.0, skipped=1,
                                         exit_code=0)
            else:
                result = engine.render(clip, progress=self._progress(job["id"]))
                done = self.queue.finish(job["id"], "done", output=str(result.output), exit_code=0,
                                         seconds=round(time.perf_counter() - t0, 3), timings=result.timings)
                self.metrics.rendered(result.timings)
        except JobCancelled:
            if self._stop.is_set() and job["id"] not in self._cancel:      # the server stops: run it next time
                self.queue.finish(job["id"], "queued", progress=None)
                self.log({"job": job["id"], "state": "queued", "why": "server stopping"})
                return
            done = self.queue.finish(job["id"], "cancelled", error="cancelled while rendering; nothing was written",
                                     seconds=round(time.perf_counter() - t0, 3))
        except LostEngine as e:
            if job["attempts"] < MAX_ATTEMPTS:              # on the next free engine
                self.queue.finish(job["id"], "queued", progress=None)
                self.log({"job": job["id"], "state": "queued", "why": str(e)})
                return
            done = self.queue.finish(job["id"], "failed", exit_code=EXIT_INTERNAL,
                                     seconds=round(time.perf_counter() - t0, 3),
                                     error=one_line(f"{e} ({job['attempts']} attempts); render that request alone "
                                                    "with `ditto-fast render` to see why"))
        except DittoError as e:
            done = self.queue.finish(job["id"], "failed", error=str(e), exit_code=e.exit_code,
                                     seconds=round(time.perf_counter() - t0, 3))
        except Exception as e:  # noqa: BLE001 - one job's bug must not stop the server
            done = self.queue.finish(job["id"], "failed", exit_code=1, seconds=round(time.perf_counter() - t0, 3),
                                     error=one_line(f"internal error: {type(e).__name__}: {e}; render that request "
                                                    "with `ditto-fast render` and DITTO_FAST_DEBUG=1 and report it"))
        self.ended(done)

    def ended(self, job: dict) -> None:
        """A job reached its final state: metrics, the log line and its callback."""
        self.metrics.ended(job)
        self.log({"job": job["id"], "state": job["status"], "seconds": job["seconds"], "output": job["output"],
                  "error": job["error"], "exit_code": job["exit_code"],
                  **({"skipped": True} if job["skipped"] else {})})
        if job["callback"]:
            post_job(job["callback"], json.dumps(job_view(job)).encode(), self.log, job["id"])
