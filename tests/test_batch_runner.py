"""The batch runner's bookkeeping, the same for local and Ray executors: fail-fast, what an interrupt or a signal
leaves in each unfinished job, and one job's outcome recorded whatever its render raised."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book, run_job
from ditto_fast.core.errors import (EXIT_INTERRUPTED, EXIT_SOME_FAILED, EXIT_TERMINATED, AvatarError, Terminated)
from ditto_fast.engine.renderer import RenderResult
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


def test_one_job_records_its_outcome_whatever_its_render_raised(tmp_path):
    jobs = _book(3, tmp_path).jobs
    seen = []
    profile = {"frames": 7, "stages": {"render": 0.5}}
    run_job(jobs[0], lambda: RenderResult(tmp_path / "0.mp4", profile, warnings=("quiet",)), then=seen.append)
    assert (jobs[0].status, jobs[0].frames, jobs[0].extra) == ("done", 7, {"stages": {"render": 0.5},
                                                                            "warnings": ["quiet"]})
    assert [r.timings for r in seen] == [profile]

    def damaged():
        time.sleep(0.02)                                    # a job that failed after a while: its time is counted
        raise AvatarError("ruby: damaged")

    def bug():
        raise KeyError("x")

    run_job(jobs[1], damaged)
    run_job(jobs[2], bug)
    assert (jobs[1].status, jobs[1].exit_code, jobs[1].error) == ("failed", 5, "ruby: damaged")
    assert jobs[2].exit_code == 1 and jobs[2].error.startswith("internal error: KeyError")
    assert jobs[1].seconds >= 0.02 and all(0 < j.seconds < 5 for j in jobs)     # each job timed, a failed one too
