"""The serve queue's leases and attempts: a restart re-queues only what no live server holds, a job that keeps
killing its engine is failed with a line saying so, no late writer overwrites a final state, a cancel outlives a
restart, a re-run shows no progress of the dead attempt, and a final job's callback is kept in the queue."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid

import pytest

from ditto_fast.serve.jobs.lease import Lease
from ditto_fast.serve.jobs.queue import JobQueue
from support import gone_lease


def test_a_restart_requeues_only_the_jobs_of_a_dead_server(tmp_path):
    path = tmp_path / "jobs.sqlite"
    gone, alive = JobQueue(path, gone_lease()), JobQueue(path)       # a killed server, and one still running
    a, b = gone.submit({"avatar": "a"}), gone.submit({"avatar": "b"})
    assert gone.take()["id"] == a["id"] and alive.take()["id"] == b["id"]
    started = JobQueue(path)                                            # the next start
    recovered = started.recover()
    assert [(j["id"], j["status"], j["crashes"]) for j in recovered] == [(a["id"], "queued", 1)]
    assert started.get(b["id"])["status"] == "running"                  # the live server's job is left alone
    assert started.finish(b["id"], "failed", error="mine now") is None  # and is not this server's to end
    assert alive.finish(b["id"], "done", exit_code=0)["status"] == "done"
    again = started.take()
    assert again["id"] == a["id"] and again["attempts"] == 2 and again["lease"] == started.lease.token


def test_a_reused_pid_is_not_taken_for_the_server_that_had_it(tmp_path):
    me = Lease.this_process()
    impostor = Lease(uuid.uuid4().hex, me.host, os.getpid(), "another boot:12345")   # our pid, another start
    q = JobQueue(tmp_path / "jobs.sqlite", impostor)
    job = q.submit({"avatar": "a"})
    q.take()
    assert [j["id"] for j in JobQueue(tmp_path / "jobs.sqlite").recover()] == [job["id"]]


def test_a_job_that_keeps_killing_its_engine_is_failed_with_a_line_saying_so(tmp_path):
    q = JobQueue(tmp_path / "jobs.sqlite")
    job = q.submit({"avatar": "a"}, callback="http://mam.example/hook")
    q.take()
    first = q.engine_died(job["id"], "SIGKILL")
    assert first["status"] == "queued" and first["crashes"] == 1 and first["lease"] is None
    q.take()
    second = q.engine_died(job["id"], "SIGSEGV")
    assert second["status"] == "failed" and second["exit_code"] == 1 and second["attempts"] == 2
    assert second["error"] == ("killed its engine 2 times (SIGKILL, SIGSEGV); render it alone with `ditto-fast "
                               "render` to see why")
    assert q.take() is None and q.engine_died(job["id"], "SIGKILL") is None   # final: never run again
    [callback] = q.callbacks_of(job["id"])
    assert json.loads(callback["body"])["status"] == "failed"


def test_a_server_crash_loop_ends_the_job_it_keeps_dying_on(tmp_path):
    """Under `Restart=always`, a job that kills its server each time is failed at the max_crashes'th start."""
    path = tmp_path / "jobs.sqlite"
    job = JobQueue(path).submit({"avatar": "a"})
    for start in range(4):
        q = JobQueue(path, gone_lease() if start < 3 else None)
        q.recover(max_crashes=3)
        if start < 3:
            assert q.take()["id"] == job["id"]          # ... and the server dies rendering it
    ended = q.get(job["id"])
    assert ended["status"] == "failed" and ended["crashes"] == 3 and "killed its engine 3 times (server died, " \
        "server died, server died)" in ended["error"] and q.take() is None


def test_no_late_writer_overwrites_a_final_state(tmp_path):
    path = tmp_path / "jobs.sqlite"
    first = JobQueue(path)
    job = first.submit({"avatar": "a"})
    first.take()
    assert first.finish(job["id"], "done", exit_code=0, output="/out/a.mp4")["status"] == "done"
    assert first.finish(job["id"], "failed", error="being written by another process") is None
    assert first.requeue(job["id"]) is None and first.engine_died(job["id"], "SIGKILL") is None
    assert first.set_progress(job["id"], {"stage": "frames", "done": 1, "total": 2}) is False
    other = JobQueue(path)
    assert other.finish(job["id"], "failed", error="late") is None
    after = first.get(job["id"])
    assert (after["status"], after["error"], after["output"], after["progress"]) == ("done", None, "/out/a.mp4", None)
    with pytest.raises(ValueError):
        first.finish(job["id"], "queued")


def test_a_cancel_asked_while_running_outlives_a_restart(tmp_path):
    path = tmp_path / "jobs.sqlite"
    gone = JobQueue(path, gone_lease())
    job = gone.submit({"avatar": "a"}, callback="http://mam.example/hook")
    gone.take()
    assert not gone.cancel_requested(job["id"])
    assert gone.cancel(job["id"]) == "running" and gone.cancel_requested(job["id"])
    assert gone.get(job["id"])["status"] == "running"                 # its renderer stops at its next frame batch
    started = JobQueue(path)
    [ended] = started.recover()                                       # ... but the server died first
    assert ended["status"] == "cancelled" and started.take() is None  # not rendered again
    assert json.loads(started.callbacks_of(job["id"])[0]["body"])["status"] == "cancelled"


def test_a_rerun_job_shows_no_progress_of_the_dead_attempt(tmp_path):
    path = tmp_path / "jobs.sqlite"
    gone = JobQueue(path, gone_lease())
    job = gone.submit({"avatar": "a"})
    gone.take()
    assert gone.set_progress(job["id"], {"stage": "frames", "done": 40, "total": 50})
    started = JobQueue(path)
    assert started.recover()[0]["progress"] is None
    assert started.take()["progress"] is None
    assert gone.set_progress(job["id"], {"stage": "frames", "done": 45, "total": 50}) is False   # a late tick
    assert started.get(job["id"])["progress"] is None
    requeued = started.requeue(job["id"])           # a clean stop: queued again, not counted as a crash
    assert requeued["progress"] is None and requeued["status"] == "queued" and requeued["crashes"] == 1


def test_a_final_job_s_callback_is_written_with_its_state_and_each_try_recorded(tmp_path):
    q = JobQueue(tmp_path / "jobs.sqlite")
    with_hook = q.submit({"avatar": "a"}, callback="http://mam.example/hook")
    without = q.submit({"avatar": "b"})
    for _ in range(2):
        q.finish(q.take()["id"], "done", exit_code=0)
    [due] = q.callbacks_due()
    assert due["job"] == with_hook["id"] and json.loads(due["body"])["id"] == with_hook["id"]
    assert not q.callbacks_of(without["id"])
    q.callback_tried(due["id"], "HTTP 503", retry_at=due["due"] + 60)
    assert q.callbacks_due() == [] and q.next_callback_due() == pytest.approx(due["due"] + 60)
    q.callback_tried(due["id"], None)
    [done] = q.callbacks_of(with_hook["id"])
    assert done["tries"] == 2 and done["sent"] is not None and q.next_callback_due() is None


def test_a_queue_written_by_an_older_server_opens_and_its_running_job_is_recovered(tmp_path):
    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:          # the columns an older queue had (profile: before timings)
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, priority INTEGER NOT NULL, "
                   "status TEXT NOT NULL, request TEXT NOT NULL, source TEXT NOT NULL, watch_path TEXT, moved INTEGER "
                   "NOT NULL DEFAULT 0, callback TEXT, created REAL NOT NULL, started REAL, finished REAL, output "
                   "TEXT, error TEXT, exit_code INTEGER, seconds REAL, profile TEXT, progress TEXT, attempts INTEGER "
                   "NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0)")
        db.execute("INSERT INTO jobs (id, seq, priority, status, request, source, created, attempts) "
                   "VALUES ('old', 1, 0, 'running', '{}', 'api', 0, 1)")
    q = JobQueue(path)
    assert [j["status"] for j in q.recover()] == ["queued"] and q.take()["attempts"] == 2
