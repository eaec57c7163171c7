"""A batch as `ditto-fast batch` runs it: the jobs read from a JSON-lines file or made from a folder of speech,
the report and previews checked against every input and output of the batch, then the jobs run here or on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from ditto_fast.batch.jobs import Job, check_side_files, jobs_from_dir, read_jobs
from ditto_fast.batch.local import run_batch
from ditto_fast.batch.ray_actors import run_batch_ray
from ditto_fast.checkpoints import resolve_root
from ditto_fast.core.memory import reuse_freed_memory
from ditto_fast.delivery.profiles import load_profile
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.stages import Progress
from ditto_fast.preview.paths import preview_paths


def collect_jobs(jobs_file: Path | None, avatar: str | None, audio_dir: Path | None, out_dir: Path | None,
                 defaults: dict[str, Any]) -> list[Job]:
    """The jobs of JOBS_FILE, or one per speech file of `audio_dir` for `avatar` into `out_dir`; `defaults` (None
    values left out) give the request fields a job does not. A bad delivery profile among them is bad usage of the
    whole batch, refused before anything loads."""
    defaults = {k: v for k, v in defaults.items() if v is not None}
    if "delivery" in defaults:
        load_profile(defaults["delivery"])
    if jobs_file is not None:
        return read_jobs(jobs_file, defaults)
    return jobs_from_dir(avatar, audio_dir, out_dir, defaults)


def launch(jobs: list[Job], options: EngineOptions, *, ray: str | None = None, workers: int | None = None,
           force: bool = False, fail_fast: bool = False, report: Path | None = None, previews: Path | None = None,
           reads: Iterable[Path | None] = (), progress: Progress | None = None,
           warn: Callable[[str], None] | None = None) -> list[Job]:
    """Run `jobs` with one engine here, or on the Ray cluster at `ray` (at most `workers` actors), after checking
    that the report and the previews (a PNG per rendered job in the folder `previews`) overwrite no input (`reads`:
    the jobs file, the config file; and the checkpoints, every job's files and avatars) and no job's output."""
    if report is not None:
        check_output_path(report, example="report.json")
    targets = preview_paths(previews, {j.index: j.output for j in jobs if j.output}) if previews else {}
    check_side_files(jobs, report, targets, [*reads, resolve_root(options.checkpoints)],
                     options.settings().clip.emotion)
    if ray is not None:
        return run_batch_ray(jobs, options, address=ray, workers=workers, force=force, fail_fast=fail_fast,
                             report=report, progress=progress, warn=warn)
    setup = RenderSetup.resolve(options)
    reuse_freed_memory()
    return run_batch(jobs, setup, force=force, fail_fast=fail_fast, report=report, progress=progress,
                     previews=targets, warn=warn)
