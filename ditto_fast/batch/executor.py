"""Executing a batch's checked jobs on engine handles (ditto_fast/handles/): an engine process on this machine, or
Ray actors. Each handle takes the next job from the book as it frees up (one handle: in the calling thread; several:
a thread each). An engine is started only when a job needs it, so a rerun of finished jobs loads no network; a job
whose engine died runs once more on a fresh one, then fails saying why (each death a warning line, and its cause in
the job's report row, "crash_causes")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book, run_job
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, InputError
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.stages import Progress
from ditto_fast.handles.base import EngineDied, EngineHandle, EngineJob, JobCancelled

MAX_ATTEMPTS = 2                # a job whose engine died under it runs once more


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
        self._to_render = len(book.queue)
        if len(self.handles) == 1:
            self._drive(self.handles[0], book)
        elif self.handles:
            threads = [threading.Thread(target=self._drive, args=(h, book), name=f"ditto-fast-batch-{h.name}",
                                        daemon=True) for h in self.handles]
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

    # ------------------------------------------------------------------ one engine's jobs
    def _drive(self, handle: EngineHandle, book: Book) -> None:
        started = False
        while not self._stop.is_set():
            with self._lock:
                if not started and self.render_setup is None and not book.queue:
                    return
            if not started:
                if not self._start(handle, book):
                    return
                started = True
            with self._lock:
                job = book.take()
            if job is None or not self._run(handle, book, job):
                return

    def _start(self, handle: EngineHandle, book: Book) -> bool:
        """Start `handle`'s engine; with no known render setup, skip the jobs its setup finds finished first."""
        try:
            handle.start()
        except Exception as e:  # noqa: BLE001 - a DittoError, or Ray's own: this engine takes no job
            e = e if isinstance(e, DittoError) else InputError(f"{handle.name} could not start: {type(e).__name__}: "
                                                               f"{e}")
            with self._lock:
                self._unable = e
                self._note(handle, str(e))
            return False
        with self._lock:
            self._note(handle, None)
            if self.render_setup is None:
                self._total -= sum(j.frames for j in book.skip_finished(handle.setup))
        return True

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

    def _tick(self, book: Book) -> Progress | None:
        """One engine: the job's own stages as "job K/T stage" (T: the jobs this batch renders)."""
        if self.progress is None or len(self.handles) != 1:
            return None
        k, total = self._to_render - len(book.queue), self._to_render
        return lambda stage, done, n: self.progress(f"job {k}/{total} {stage}", done, n)

    def _run(self, handle: EngineHandle, book: Book, job: Job) -> bool:
        """Render one job on `handle` and record its outcome; False when the handle can take no more (its engine
        died and no fresh one starts, or the batch stops)."""
        clip = book.clips[job.index]
        if self.on_dispatch:
            self.on_dispatch(job, handle)
        if self.progress and len(self.handles) > 1 and not self._done_frames:
            self.progress("frames of finished jobs", 0, self._total)
        attempts, alive = job.extra.get("attempts", 0) + 1, True
        engine_job = EngineJob(clip.request, clip.audio, label=f"job {job.index}")
        try:
            run_job(job, lambda: handle.render(engine_job, progress=self._tick(book)),
                    then=(lambda result: self.then(job, result, clip)) if self.then else None)
        except JobCancelled:
            return False
        except EngineDied as e:
            if self._stop.is_set():
                return False
            job.extra["attempts"] = attempts
            job.extra["crash_causes"] = [*job.extra.get("crash_causes", []), str(e)]     # in its report row
            again = attempts < MAX_ATTEMPTS
            if self.warn:
                self.warn(f"job {job.index}: {e}; " + ("it runs once more on a fresh engine" if again else
                                                       f"failed: its engine died on each of its {attempts} attempts"))
            if again:                               # back in the queue first: another engine may take it
                with self._lock:
                    book.again(job)
                return self._restart(handle)
            alive = self._restart(handle)
            job.fail(f"{e}, on each of its {attempts} attempts; render it alone to see why", EXIT_INTERNAL)
        info = handle.info if "node_id" in handle.info else None       # a Ray actor's node
        if info or attempts > 1:
            job.extra["attempts"] = attempts
        if info:
            job.extra["node"], job.extra["node_id"] = info["node"], info["node_id"]
            job.extra["torch_threads"] = info.get("torch_threads")
        with self._lock:
            if self.progress and len(self.handles) > 1:
                self._done_frames += clip.frames
                self.progress("frames of finished jobs", self._done_frames, self._total)
            book.write()
        return alive

    def _restart(self, handle: EngineHandle) -> bool:
        """A fresh engine for one that died; False if none starts (this handle takes no more jobs)."""
        try:
            handle.restart()
        except Exception as e:  # noqa: BLE001 - a DittoError, or Ray's own
            with self._lock:
                self._unable = e if isinstance(e, DittoError) else InputError(
                    f"{handle.name} could not start again: {type(e).__name__}: {e}")
            return False
        return True
