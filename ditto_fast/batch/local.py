"""A batch on this machine: every job checked first, finished ones skipped, the rest rendered by one engine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ditto_fast.avatar import Avatar
from ditto_fast.batch.jobs import EXIT_SOME_FAILED, Job, check_jobs, is_finished, record_result, write_report
from ditto_fast.core.errors import DittoError, Terminated
from ditto_fast.engine.renderer import Renderer, RenderResult
from ditto_fast.engine.setup import RenderSetup
from ditto_fast.engine.stages import Progress
from ditto_fast.preview.paths import preview_paths


def _preview(job: Job, path: Path, result: RenderResult, avatar: Avatar) -> None:
    """Write a done job's preview; a failure is noted in its report row ("preview_error"), the job stays done."""
    from ditto_fast.preview.render_strip import write_render_preview

    try:
        job.extra["preview"] = str(write_render_preview(
            path, result.output, job.audio, result.profile["frames"], result.profile["rate"], mouth=result.mouth,
            M_c2o=avatar.M_c2o, size=avatar.size, random_weights=result.profile["random_weights"]))
    except Exception as e:  # noqa: BLE001 - the clip itself is fine; say what went wrong with its picture
        job.extra["preview_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__


def run_batch(jobs: list[Job], setup: RenderSetup, *, force: bool = False, fail_fast: bool = False,
              report: str | Path | None = None, progress: Progress | None = None,
              on_job: Callable[[Job], None] | None = None, previews: str | Path | None = None) -> list[Job]:
    """Check all jobs, skip those whose output was made from the same inputs (unless `force`), render the rest
    with one engine; `progress` hears each rendered job's stages as "job K/T <stage>". The report (if any) is
    rewritten after every job and when interrupted. With `previews` (a folder) each rendered job also gets a
    preview PNG there, named in its report row."""
    targets = preview_paths(previews, {j.index: j.output for j in jobs if j.output}) if previews else {}
    clips = check_jobs(jobs, setup)
    for job in jobs:
        clip = clips.get(job.index)
        if clip is not None and not force and is_finished(job, clip, setup):
            job.status, job.frames = "skipped", clip.frames
            if job.index in targets and targets[job.index].exists():
                job.extra["preview"] = str(targets[job.index])
    todo = [j for j in jobs if j.status == "pending"]
    try:
        if report:
            write_report(report, jobs)
        renderer = Renderer(setup=setup) if todo else None
        for k, job in enumerate(todo, 1):
            if fail_fast and any(j.status == "failed" for j in jobs):
                job.fail("not run: an earlier job failed (--fail-fast)", EXIT_SOME_FAILED)
                continue
            t0 = time.perf_counter()
            tick = (lambda stage, d, n, k=k: progress(f"job {k}/{len(todo)} {stage}", d, n)) if progress else None
            try:
                result = renderer.render(clips[job.index], progress=tick)
                record_result(job, result.profile, result.warnings)
                if job.index in targets:
                    _preview(job, targets[job.index], result, clips[job.index].avatar)
            except DittoError as e:
                job.fail(e)
            except Exception as e:  # noqa: BLE001 - a bug in one job must not lose the night's other jobs
                job.fail(f"internal error: {type(e).__name__}: {e}; rerun that job alone with DITTO_FAST_DEBUG=1", 1)
            job.seconds = time.perf_counter() - t0
            if on_job:
                on_job(job)
            if report:
                write_report(report, jobs)
    except BaseException as e:
        if isinstance(e, DittoError):
            why, code = str(e), e.exit_code
        else:
            code = 130 if isinstance(e, KeyboardInterrupt) else 143 if isinstance(e, Terminated) else 1
            why = "interrupted before it finished; run the batch again to resume" if code != 1 else \
                f"not run: internal error {type(e).__name__}: {e}"
        for job in jobs:
            if job.status == "pending":
                job.fail(why, code)
        raise
    finally:
        if report:
            write_report(report, jobs)
    return jobs
