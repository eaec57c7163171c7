"""Executing a batch's checked jobs on engine handles (ditto_fast/handles/): an engine process on this machine, or
Ray actors. Each handle takes the next job from the book as it frees up (one handle: in the calling thread; several:
a thread each), through the job driver (handles/driver.py), for which the executor is the book's job store. An engine
is started only when a job needs it, so a rerun of finished jobs loads no network; a job whose engine died runs once
more on a fresh one, then fails saying why (each death a warning line, and its cause in the job's report row,
"crash_causes"); a dead engine is started again at once, then after 5 and 30 s, then its handle takes no more jobs."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ditto_fast.batch.jobs import Job, record_result
from ditto_fast.batch.runner import Book
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, InputError
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.stages import Progress
from ditto_fast.handles.base import EngineHandle
from ditto_fast.handles.driver import Rendering, RetryPolicy, drive


class EngineExecutor:
    """Executes checked jobs on `handles` (see runner.Executor). `render_setup`: what they render with when known
    before any engine starts (an engine here), else None (each Ray actor's setup skips finished jobs before any job
    goes to it). With one engine `progress` hears each job's stages ("job K/T frames"); with several, the frames of
    finished jobs. `then(job, result, clip)` runs after each rendered job (its preview)."""

    def __init__(self, check_setup: RenderSetup, render_setup: RenderSetup | None,
                 handles: Callable[[Book], list[EngineHandle]], *, progress: Progress | None = None,
                 then: Callable[[Job, Any, Any], None] | None = None, warn: Callable[[str], None] | None = None,
                 on_dispatch: Callable[[Job, EngineHandle], None] | None = None, nodes: bool = False,
                 close: Callable[[], None] | None = None):
        self.check_setup, self.render_setup = check_setup, render_setup
        self.make_handles, self.progress, self.then, self.warn = handles, progress, then, warn
        self.on_dispatch, self._close = on_dispatch, close
        self.extra: dict[str, Any] = {"ray_nodes": []} if nodes else {}     # in the report beside the jobs
        self.handles: list[EngineHandle] = []
        self.policy = RetryPolicy()
        self.book: Book | None = None
        self._taken: dict[int, EngineHandle] = {}       # job index -> the handle that took it
        self._runs: dict[int, int] = {}                 # job index -> how often it went to an engine
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._nodes: dict[str, dict[str, Any]] | None = {} if nodes else None
        self._unable: DittoError | None = None       # why the last engine that could not start could not
        self._total = self._done_frames = self._to_render = 0

    def start(self, book: Book) -> None:
        self.handles = self.make_handles(book) if book.queue else []
        self._total = sum(book.clips[j.index].frames for j in book.queue)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        if self._close:
            self._close()

    def execute(self, book: Book) -> None:
        self.book, self._to_render = book, len(book.queue)
        if len(self.handles) == 1:
            drive(self.handles[0], self, self.policy, self._stop, start=True)
        elif self.handles:
            threads = [threading.Thread(target=drive, args=(h, self, self.policy, self._stop), kwargs={"start": True},
                                        name=f"ditto-fast-batch-{h.name}", daemon=True) for h in self.handles]
            for t in threads:
                t.start()
            try:
                for t in threads:
                    while t.is_alive():
                        t.join(0.5)
            except BaseException:
                self._stop.set()                    # an interrupt: every engine is let go now, its job unfinished
                for handle in self.handles:
                    handle.close()
                for t in threads:                   # each records nothing more once its engine is gone
                    t.join(10)
                raise
        if book.queue:                              # no engine could render them
            why = f" ({self._unable})" if self._unable else ""
            book.fail_queued(f"not run: no engine is left{why}",
                             self._unable.exit_code if self._unable else EXIT_INTERNAL)

    # ------------------------------------------------------------------ the book as the driver's job store
    def take(self, handle: EngineHandle) -> Job | None:
        with self._lock:
            job = self.book.take()
            if job is not None:
                self._taken[job.index] = handle
            return job

    def idle(self, handle: EngineHandle) -> bool:
        return False                                # the queue only shrinks: none now is none for good

    def put_back(self, job: Job) -> None:
        with self._lock:
            self.book.again(job)

    def check(self, job: Job) -> Clip:
        return self.book.clips[job.index]           # checked with every other job before any engine started

    def skip(self, job: Job, clip: Clip, setup: RenderSetup) -> bool:
        with self._lock:
            if not self.book.finished(job, setup):
                return False
            self._total -= clip.frames
            self.book.write()
        return True

    def watch(self, job: Job, handle: EngineHandle) -> Rendering:
        if self.on_dispatch:
            self.on_dispatch(job, handle)
        with self._lock:
            self._runs[job.index] = self._runs.get(job.index, 0) + 1
            if self.progress and len(self.handles) > 1 and not self._done_frames:
                self.progress("frames of finished jobs", 0, self._total)
        return Rendering(f"job {job.index}", self._tick())

    def preview(self, job: Job, result: RenderResult, clip: Clip) -> None:
        if self.then:
            self.then(job, result, clip)

    def done(self, job: Job, result: RenderResult, seconds: float) -> None:
        record_result(job, result.timings, result.warnings)
        self._record(job, seconds)

    def failed(self, job: Job, error: str | DittoError, exit_code: int, seconds: float) -> None:
        job.fail(error, exit_code)
        self._record(job, seconds)

    def cancelled(self, job: Job, seconds: float) -> None:
        self.put_back(job)                          # only a batch being stopped cancels: it says why

    def died(self, job: Job, cause: str, policy: RetryPolicy) -> None:
        with self._lock:
            attempts = job.extra["attempts"] = self._runs.get(job.index, 1)
            causes = job.extra["crash_causes"] = [*job.extra.get("crash_causes", []), cause]    # in its report row
            again = policy.again(len(causes))
            if self.warn:
                self.warn(f"job {job.index}: {cause}; " + ("it runs once more on a fresh engine" if again else
                                                           f"failed: its engine died on each of its {attempts} "
                                                           "attempts"))
            if again:                               # back in the queue first: another engine may take it
                self.book.again(job)
                return
        job.fail(policy.gave_up(causes), EXIT_INTERNAL)
        self._record(job, job.seconds)

    def let_go(self, job: Job) -> None:
        with self._lock:
            self._taken.pop(job.index, None)

    def lost(self, job: Job, error: Exception) -> None:
        raise error                                 # the report could not be written, say: the batch stops on it

    def engine(self, handle: EngineHandle, error: Exception | None, restarted: bool,
               next_try_s: float | None) -> None:
        """A first start: the node's record, and the jobs its setup finds finished skipped (Ray); a failed one: why
        (the last such reason fails the jobs no engine is left for)."""
        with self._lock:
            if error is not None:
                self._unable = error if isinstance(error, DittoError) else InputError(
                    f"{handle.name} could not start{' again' if restarted else ''}: {type(error).__name__}: {error}")
                if not restarted:
                    self._note(handle, str(self._unable))
                elif next_try_s is not None and self.warn:
                    self.warn(f"{self._unable}; it is tried again in {next_try_s:g} s")
            elif not restarted:
                self._note(handle, None)
                if self.render_setup is None:
                    self._total -= sum(j.frames for j in self.book.skip_finished(handle.setup))

    # ------------------------------------------------------------------ the report
    def _note(self, handle: EngineHandle, error: str | None) -> None:
        """A Ray node's record in the report: its actors, and why one could not render (said once a node)."""
        info = handle.info
        if self._nodes is None or "node_id" not in info:
            return
        node = self._nodes.setdefault(info["node_id"], {"node": info["node"], "node_id": info["node_id"],
                                                         "actors": 0, "error": None})
        if error is None:
            node["actors"] += 1
        elif node["error"] is None:
            node["error"] = error
            if self.warn:
                where = f"{info['node']} (node id {info['node_id'][:12]})" if info["node"] else "unknown node"
                self.warn(f"Ray {where}: no job runs there: {error}")
        self.extra["ray_nodes"] = list(self._nodes.values())

    def _tick(self) -> Progress | None:
        """One engine: the job's own stages as "job K/T stage" (T: the jobs this batch renders)."""
        if self.progress is None or len(self.handles) != 1:
            return None
        k, total = self._to_render - len(self.book.queue), self._to_render
        return lambda stage, done, n: self.progress(f"job {k}/{total} {stage}", done, n)

    def _record(self, job: Job, seconds: float) -> None:
        """A job that came back: its time, how often it ran and where (a Ray actor's node), the frames of finished
        jobs, the report rewritten."""
        with self._lock:
            job.seconds = seconds
            attempts = self._runs.get(job.index, 1)
            handle = self._taken.get(job.index)
            info = handle.info if handle is not None and "node_id" in handle.info else None     # a Ray actor's node
            if info or attempts > 1:
                job.extra["attempts"] = attempts
            if info:
                job.extra["node"], job.extra["node_id"] = info["node"], info["node_id"]
                job.extra["torch_threads"] = info.get("torch_threads")
            if self.progress and len(self.handles) > 1:
                self._done_frames += self.book.clips[job.index].frames
                self.progress("frames of finished jobs", self._done_frames, self._total)
            self.book.write()
