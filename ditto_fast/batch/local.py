"""A batch on this machine: one engine in this process, loaded for the first job to render, renders the jobs one
after another (and each one's preview PNG, when asked for)."""

from __future__ import annotations

from pathlib import Path

from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book, run_job, run_jobs
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import Renderer, RenderResult
from ditto_fast.engine.single import write_preview
from ditto_fast.engine.stages import Progress


class LocalEngine:
    """Executes checked jobs with one engine here; `progress` hears each job's stages as "job K/T <stage>"."""

    def __init__(self, setup: RenderSetup, progress: Progress | None = None, previews: dict[int, Path] | None = None):
        self.check_setup = self.render_setup = setup
        self.progress, self.previews, self.extra = progress, previews or {}, {}

    def start(self, book: Book) -> None:
        pass

    def execute(self, book: Book) -> None:
        renderer, total = None, len(book.queue)
        while (job := book.take()) is not None:
            if renderer is None:                # its load time goes into the first render's timings
                renderer = Renderer(setup=self.render_setup)
            k, clip = total - len(book.queue), book.clips[job.index]
            tick = (lambda stage, d, n, k=k: self.progress(f"job {k}/{total} {stage}", d, n)) if self.progress \
                else None
            run_job(job, lambda: renderer.render(clip, progress=tick),
                    then=(lambda result: _preview(job, self.previews[job.index], result, clip))
                    if job.index in self.previews else None)
            book.write()

    def close(self) -> None:
        pass


def _preview(job: Job, path: Path, result: RenderResult, clip: Clip) -> None:
    """Write a done job's preview; a failure is noted in its report row ("preview_error"), the job stays done."""
    try:
        job.extra["preview"] = str(write_preview(path, result, clip))
    except Exception as e:  # noqa: BLE001 - the clip itself is fine; say what went wrong with its picture
        job.extra["preview_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__


def run_batch(jobs: list[Job], setup: RenderSetup, *, force: bool = False, fail_fast: bool = False,
              report: str | Path | None = None, progress: Progress | None = None,
              previews: dict[int, Path] | None = None) -> list[Job]:
    """Run `jobs` here with one engine (see runner.run_jobs); with `previews` (job index -> PNG path, from
    preview_paths) each rendered job also gets its preview PNG, named in its report row."""
    return run_jobs(jobs, LocalEngine(setup, progress, previews), force=force, fail_fast=fail_fast, report=report,
                    previews=previews)
