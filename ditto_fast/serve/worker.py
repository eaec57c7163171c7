"""The server's one render thread: takes the next job from the queue and renders it with the warm engine exactly as
`render` would (the same request, checks and bytes); a request identical to a finished one (its output carries the
same digest) is done at once. Progress goes to the queue; a cancelled job stops at its next frame batch."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable

from ditto_fast.batch.jobs import clip_is_finished
from ditto_fast.core.errors import DittoError, one_line
from ditto_fast.engine.clip import check_clip
from ditto_fast.engine.renderer import Renderer
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.callbacks import post_job
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.queue import JobQueue, job_view

PROGRESS_EVERY_S = 0.5          # the queue's progress of a running job is at most this old


class JobCancelled(Exception):
    """Raised inside a render whose job was cancelled (or whose server is stopping): the render's own clean-up
    leaves nothing at its output."""


def request_of(job: dict) -> RenderRequest:
    """The RenderRequest a queued job holds (checked when it was accepted; paths absolute)."""
    return RenderRequest.from_json(job["request"], Path("/"), f"job {job['id']}")


class Worker:
    """Renders queued jobs one at a time in its own thread, with one engine loaded once."""

    def __init__(self, engine: Renderer, queue: JobQueue, metrics: Metrics, log: Callable[[dict], None]):
        self.engine, self.queue, self.metrics, self.log = engine, queue, metrics, log
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._cancel: set[str] = set()
        self.running: str | None = None
        self._thread = threading.Thread(target=self._loop, name="ditto-fast-render", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the running job's next frame batch (that job is queued again) and wait for the thread."""
        self._stop.set()
        self.wake.set()
        self._thread.join(timeout)

    def cancel(self, job_id: str) -> None:
        """Stop the running job `job_id` at its next frame batch (it ends cancelled)."""
        self._cancel.add(job_id)

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self.queue.take()
            if job is None:
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            self.running = job["id"]
            try:
                self._run(job)
            finally:
                self.running = None
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

    def _run(self, job: dict) -> None:
        t0 = time.perf_counter()
        self.log({"job": job["id"], "state": "running", "attempt": job["attempts"]})
        try:
            request = request_of(job)
            clip = check_clip(request, self.engine.avatar(request.avatar), self.engine.config)
            if clip_is_finished(clip, self.engine.setup):
                done = self.queue.finish(job["id"], "done", output=str(clip.output), seconds=0.0, skipped=1,
                                         exit_code=0)
            else:
                result = self.engine.render(clip, progress=self._progress(job["id"]))
                done = self.queue.finish(job["id"], "done", output=str(result.output), exit_code=0,
                                         seconds=round(time.perf_counter() - t0, 3), profile=result.profile)
                self.metrics.rendered(result.profile)
        except JobCancelled:
            if self._stop.is_set() and job["id"] not in self._cancel:      # the server stops: run it next time
                self.queue.finish(job["id"], "queued", progress=None)
                self.log({"job": job["id"], "state": "queued", "why": "server stopping"})
                return
            done = self.queue.finish(job["id"], "cancelled", error="cancelled while rendering; nothing was written",
                                     seconds=round(time.perf_counter() - t0, 3))
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
                  "error": job["error"], "exit_code": job["exit_code"], **({"skipped": True} if job["skipped"] else {})})
        if job["callback"]:
            post_job(job["callback"], json.dumps(job_view(job)).encode(), self.log, job["id"])
