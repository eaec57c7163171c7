"""The batch runner, the same for every way of executing jobs: every job checked first, finished ones skipped
(their output carries the digest a render would write), the rest handed to an executor; fail-fast, the report
rewritten after every job and when interrupted, and what an interrupted batch leaves in it.

An executor (`executor.EngineExecutor`: one engine process here (local.py), or one engine per Ray actor
(ray_actors.py)) only executes checked jobs: it takes them from the `Book` one by one and renders each through the
job driver (handles/driver.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ditto_fast.batch.jobs import Job, check_jobs, write_report
from ditto_fast.engine.digest import clip_is_finished
from ditto_fast.core.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_SOME_FAILED, EXIT_TERMINATED, DittoError,
                                    Terminated)
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.render_setup import RenderSetup

INTERRUPTED = "interrupted before it finished; run the batch again to resume"


class Book:
    """A batch's jobs, their checked clips and the queue of those still to render; the report (if any) is written
    from here alone."""

    def __init__(self, jobs: list[Job], clips: dict[int, Clip], *, force: bool, fail_fast: bool,
                 report: str | Path | None, previews: dict[int, Path], extra: dict[str, Any]):
        self.jobs, self.clips, self.force, self.fail_fast = jobs, clips, force, fail_fast
        self.report, self.previews, self.extra = report, previews, extra
        self.queue = [j for j in jobs if j.status == "queued"]
        self._tried: dict[int, set[str]] = {}       # job -> the digests its output was compared with

    def skip_finished(self, setup: RenderSetup) -> list[Job]:
        """Take out of the queue (and mark skipped) the jobs whose output a render with `setup` would make again
        (none with `force`). The jobs taken."""
        skipped = [job for job in list(self.queue) if self.finished(job, setup)]
        for job in skipped:
            self.queue.remove(job)
        return skipped

    def finished(self, job: Job, setup: RenderSetup) -> bool:
        """Whether a render with `setup` would make the job's output again (never with `force`); if so it is marked
        skipped. Each output's tag is read once for each digest it is compared with."""
        if self.force:
            return False
        clip = self.clips[job.index]
        digest = setup.digest(clip)
        if digest in self._tried.setdefault(job.index, set()):
            return False
        self._tried[job.index].add(digest)
        if not clip_is_finished(clip, setup):
            return False
        job.status, job.frames = "skipped", clip.frames
        if job.index in self.previews and self.previews[job.index].exists():
            job.extra["preview"] = str(self.previews[job.index])
        return True

    def take(self) -> Job | None:
        """The next job to render (None when the queue is empty); with fail-fast, once a job failed, the ones
        after it fail unrun."""
        while self.queue:
            job = self.queue.pop(0)
            if self.fail_fast and any(j.status == "failed" for j in self.jobs):
                job.fail("not run: an earlier job failed (--fail-fast)", EXIT_SOME_FAILED)
                continue
            return job
        return None

    def fail_queued(self, why: str, exit_code: int) -> None:
        """Fail every job still in the queue, unrun (its executor cannot run them)."""
        for job in self.queue:
            job.fail(why, exit_code)
        self.queue.clear()

    def again(self, job: Job) -> None:
        """Put a taken job back at the head of the queue (its executor lost it)."""
        self.queue.insert(0, job)

    def write(self) -> None:
        """Rewrite the report (if any): after each job that came back, and at the start and end."""
        if self.report:
            write_report(self.report, self.jobs, self.extra)

    def stop(self, e: BaseException) -> None:
        """The batch stops on `e` (an interrupt, a signal, an error outside any one job): every job not finished
        fails with why, and the exit code the command ends with."""
        if isinstance(e, DittoError):
            why, code = str(e), e.exit_code
        else:
            code = EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else \
                EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERNAL
            why = INTERRUPTED if code != EXIT_INTERNAL else f"not run: internal error {type(e).__name__}: {e}"
        for job in self.jobs:
            if job.status == "queued":
                job.fail(why, code)


class Executor(Protocol):
    """A way to execute checked jobs."""

    check_setup: RenderSetup            # what the jobs are checked with
    render_setup: RenderSetup | None    # what they render with, when known before any starts (else the executor
    #                                     calls Book.skip_finished with each setup it learns)
    extra: dict[str, Any]               # the report's entries beside the jobs

    def start(self, book: Book) -> None:
        """Get ready (before the first report is written; nothing to undo if it fails)."""

    def execute(self, book: Book) -> None:
        """Render the book's jobs, taken one by one and handed back, until none is left."""

    def close(self) -> None:
        """Let go of what `start` took (also after an interrupt)."""


def run_jobs(jobs: list[Job], executor: Executor, *, force: bool = False, fail_fast: bool = False,
             report: str | Path | None = None, previews: dict[int, Path] | None = None) -> list[Job]:
    """Check all jobs, skip those whose output was made from the same inputs and settings (unless `force`), have
    `executor` render the rest. The report (if any) is rewritten after every job and when interrupted; a skipped
    job whose preview (`previews`: job index -> PNG) exists names it."""
    book = Book(jobs, check_jobs(jobs, executor.check_setup), force=force, fail_fast=fail_fast, report=report,
                previews=previews or {}, extra=executor.extra)
    if executor.render_setup is not None:
        book.skip_finished(executor.render_setup)
    executor.start(book)
    try:
        book.write()
        executor.execute(book)
    except BaseException as e:
        book.stop(e)
        raise
    finally:
        executor.close()
        book.write()
    return jobs

