"""The batch runner's bookkeeping, the same for local and Ray executors: fail-fast, what an interrupt or a signal
leaves in each unfinished job, one job's outcome recorded whatever its render raised, and the job driver's retry
rule as a batch keeps it (an engine handle that dies on cue: support.DyingEngine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DyingEngine, died

from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book
from ditto_fast.core.errors import (EXIT_INTERRUPTED, EXIT_SOME_FAILED, EXIT_TERMINATED, AvatarError, Terminated)
from ditto_fast.engine.request import RenderRequest


def _book(n: int, tmp_path: Path, fail_fast: bool = False) -> Book:
    jobs = [Job(i, RenderRequest("ruby", tmp_path / f"{i}.wav", tmp_path / f"{i}.mp4")) for i in range(n)]
    return Book(jobs, {}, force=False, fail_fast=fail_fast, report=tmp_path / "r.json", previews={}, extra={})


def test_fail_fast_fails_the_jobs_after_a_failure_unrun(tmp_path):
    book = _book(3, tmp_path, fail_fast=True)
    first = book.take()
    assert first.index == 0 and [j.index for j in book.queue] == [1, 2]
    first.fail(AvatarError("ruby: not registered"))
    assert book.take() is None and not book.queue
    assert [(j.status, j.exit_code) for j in book.jobs] == [("failed", 5)] + [("failed", EXIT_SOME_FAILED)] * 2
    assert all("--fail-fast" in j.error for j in book.jobs[1:])
    without = _book(2, tmp_path)
    without.take().fail("broken")
    assert without.take().index == 1                        # without fail-fast the next one runs


@pytest.mark.parametrize("stop, code, said", [
    (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted before it finished; run the batch again to resume"),
    (Terminated(), EXIT_TERMINATED, "interrupted before it finished; run the batch again to resume"),
    (AvatarError("ruby: damaged"), 5, "ruby: damaged"),
    (ValueError("a bug"), 1, "not run: internal error ValueError: a bug")])
def test_a_stopped_batch_fails_every_unfinished_job_with_why(stop, code, said, tmp_path):
    book = _book(3, tmp_path)
    book.take().status = "done"
    book.take()                                             # taken, not finished: it was running
    book.stop(stop)
    assert [j.status for j in book.jobs] == ["done", "failed", "failed"]
    assert all(j.exit_code == code and j.error == said for j in book.jobs[1:])


def test_fail_queued_and_again(tmp_path):
    book = _book(3, tmp_path)
    job = book.take()
    book.again(job)                                         # its executor lost it: first in line again
    assert [j.index for j in book.queue] == [0, 1, 2]
    book.fail_queued("not run: no Ray actor is left", 3)
    assert not book.queue and {(j.status, j.exit_code) for j in book.jobs} == {("failed", 3)}


def _executed(jobs_n: int, tmp_path: Path, *engines, warn=None, policy=None) -> list[Job]:
    """`jobs_n` jobs executed on `engines` (support.DyingEngine) by batch's executor, through the job driver."""
    from dataclasses import replace
    from types import SimpleNamespace

    from ditto_fast.batch.executor import EngineExecutor

    book = _book(jobs_n, tmp_path)
    book.clips = {j.index: SimpleNamespace(request=j.request, audio=None, frames=5, output=j.output) for j in book.jobs}
    book.force = True                                       # nothing is made before: no digest to read
    executor = EngineExecutor(None, None, lambda book: list(engines), warn=warn)
    executor.policy = policy or replace(executor.policy, restart_pauses_s=(0.0,))     # its tries, without pauses
    executor.start(book)
    executor.execute(book)
    return book.jobs


def test_one_job_records_its_outcome_whatever_its_render_raised(tmp_path):
    engine = DyingEngine([None, AvatarError("ruby: damaged"), KeyError("x")])
    jobs = _executed(3, tmp_path, engine)
    assert (jobs[0].status, jobs[0].frames, jobs[0].extra) == ("done", 5, {"stages": {}})
    assert (jobs[1].status, jobs[1].exit_code, jobs[1].error) == ("failed", 5, "ruby: damaged")
    assert jobs[2].exit_code == 1 and jobs[2].error.startswith("internal error: KeyError")
    assert all(0 <= j.seconds < 5 for j in jobs)
    rows = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert [r["status"] for r in rows] == ["done", "failed", "failed"]


def test_a_job_whose_engine_dies_runs_once_more_then_fails_naming_each_cause(tmp_path):
    warnings: list[str] = []
    jobs = _executed(3, tmp_path, DyingEngine(died(1) + [None] + died(2)), warn=warnings.append)
    assert [j.status for j in jobs] == ["done", "failed", "done"]
    assert jobs[0].extra["attempts"] == 2 and len(jobs[0].extra["crash_causes"]) == 1
    assert jobs[1].extra["attempts"] == 2 and jobs[1].exit_code == 1 and jobs[1].error == (
        "killed its engine 2 times (engine-0 its process died (SIGKILL 0), engine-0 its process died (SIGKILL 1)); "
        "render it alone with `ditto-fast render` to see why")                   # serve's words, both causes
    assert "attempts" not in jobs[2].extra
    assert [w.split(";")[1].strip() for w in warnings] == [
        "it runs once more on a fresh engine", "it runs once more on a fresh engine",
        "failed: its engine died on each of its 2 attempts"]


def test_a_dead_engine_that_does_not_start_at_once_is_tried_again_before_its_jobs_fail(tmp_path):
    warnings: list[str] = []
    jobs = _executed(2, tmp_path, DyingEngine(died(1), restarts_fail=2), warn=warnings.append)
    assert [j.status for j in jobs] == ["done", "done"]                     # the third try started it
    assert [w.split(";")[0] for w in warnings if "it is tried again in" in w] == \
        ["engine-0: cannot start the engine process"] * 2
    jobs = _executed(2, tmp_path, DyingEngine(died(1), restarts_fail=3))
    assert {(j.status, j.error) for j in jobs} == {("failed", "not run: no engine is left (engine-0: cannot start the "
                                                             "engine process)")}


def test_a_job_past_its_time_limit_fails_once_naming_it(tmp_path):
    from ditto_fast.handles.base import JobTimedOut

    jobs = _executed(2, tmp_path, DyingEngine([JobTimedOut(60)]))
    assert [j.status for j in jobs] == ["failed", "done"] and jobs[0].exit_code == 3
    assert "ran past --job-timeout (60 s)" in jobs[0].error and "crash_causes" not in jobs[0].extra
