"""A batch on this machine: one engine in a child process (ditto_fast/handles/process.py), started for the first
job to render, renders the jobs one after another (and each one's preview PNG, when asked for); a job that kills
its engine runs once more on a fresh one."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ditto_fast.batch.executor import EngineExecutor
from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import run_jobs
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.single import write_preview
from ditto_fast.engine.stages import Progress
from ditto_fast.handles.base import EngineLimits
from ditto_fast.handles.process import ProcessEngine


def _preview(previews: dict[int, Path]):
    """Write a done job's preview when one is asked for; a failure is noted in its report row ("preview_error"), the
    job stays done."""
    def then(job: Job, result: RenderResult, clip: Clip) -> None:
        if job.index not in previews:
            return
        try:
            job.extra["preview"] = str(write_preview(previews[job.index], result, clip))
        except Exception as e:  # noqa: BLE001 - the clip itself is fine; say what went wrong with its picture
            job.extra["preview_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return then


def run_batch(jobs: list[Job], setup: RenderSetup, *, force: bool = False, fail_fast: bool = False,
              report: str | Path | None = None, progress: Progress | None = None,
              previews: dict[int, Path] | None = None, limits: EngineLimits | None = None,
              warn: Callable[[str], None] | None = None) -> list[Job]:
    """Run `jobs` here with one engine process (see runner.run_jobs); with `previews` (job index -> PNG path, from
    preview_paths) each rendered job also gets its preview PNG, named in its report row; `warn` hears an engine
    that died under a job."""
    engine = ProcessEngine(setup, name="engine-0", limits=limits or EngineLimits())
    executor = EngineExecutor(setup, setup, lambda book: [engine], progress=progress,
                              then=_preview(previews or {}), warn=warn)
    return run_jobs(jobs, executor, force=force, fail_fast=fail_fast, report=report, previews=previews)
