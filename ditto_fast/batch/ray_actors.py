"""Batch scale-out on Ray: one engine per actor (an actor per GPU, or per CPU node; ditto_fast/handles/ray_engine.py),
jobs handed to actors as they free up, results back to the driver, which alone writes the report. The driver checks
every job, skips those finished by the setups the actors report, and sends each of the others its decoded audio; an
actor opens the avatar from its own view of the store."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ditto_fast.batch.executor import EngineExecutor
from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book, run_jobs
from ditto_fast.core.home import store_root
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.stages import Progress
from ditto_fast.handles.base import EngineHandle
from ditto_fast.handles.ray_cluster import ray_session
from ditto_fast.handles.ray_engine import RayFleet, ray_options


def run_batch_ray(jobs: list[Job], options: EngineOptions, *, address: str = "local", workers: int | None = None,
                  force: bool = False, fail_fast: bool = False, report: str | Path | None = None,
                  progress: Progress | None = None, on_dispatch: Callable[[Job, EngineHandle], None] | None = None,
                  warn: Callable[[str], None] | None = None) -> list[Job]:
    """Run `jobs` on Ray actors (see runner.run_jobs); a job whose actor dies is retried once on a fresh one. An
    actor that cannot render (its node does not see the store, say) gets no job: `warn` hears why, once a node,
    and the report's "ray_nodes" lists every node's actors and what stopped them."""
    prepared = ray_options(options)         # a missing checkpoint is said before Ray starts
    with ray_session(address) as ray:
        fleet = RayFleet(ray, options, workers, prepared=prepared)

        def handles(book: Book) -> list[EngineHandle]:
            folders = [store_root() / "avatars", *(j.output.parent for j in book.queue)]
            return list(fleet.plan(folders, most=len(book.queue)))

        executor = EngineExecutor(fleet.check_setup, None, handles, progress=progress, warn=warn,
                                  on_dispatch=on_dispatch, nodes=True, close=fleet.close)
        return run_jobs(jobs, executor, force=force, fail_fast=fail_fast, report=report)
