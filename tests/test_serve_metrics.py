"""The server's Prometheus metrics: the attempts each job took and the crashes under jobs, by what became of them."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from ditto_fast.serve.metrics import Metrics  # noqa: E402
from ditto_fast.serve.jobs.queue import JobQueue  # noqa: E402


def test_job_attempts_and_crashes_are_in_the_exposition(tmp_path):
    q = JobQueue(tmp_path / "jobs.sqlite")
    metrics = Metrics(q)
    job = q.submit({"avatar": "a"})
    q.take()
    metrics.crashed(q.engine_died(job["id"], "SIGKILL"))            # queued again
    q.take()
    metrics.ended(q.finish(job["id"], "done", exit_code=0))
    other = q.submit({"avatar": "b"})
    for cause in ("SIGSEGV", "out of memory"):
        q.take()
        metrics.crashed(q.engine_died(other["id"], cause))          # the second time: failed
    metrics.ended(q.get(other["id"]))
    text = metrics.exposition().decode()
    assert 'ditto_fast_job_crashes_total{outcome="queued"} 2.0' in text
    assert 'ditto_fast_job_crashes_total{outcome="failed"} 1.0' in text
    assert 'ditto_fast_job_attempts_bucket{le="1.0"} 0.0' in text and 'ditto_fast_job_attempts_bucket{le="2.0"} 2.0' in text
    assert "ditto_fast_job_attempts_count 2.0" in text
