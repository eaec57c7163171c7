"""Serve's dispatcher as the job driver's store (handles/driver.py) over a real queue, on engine handles whose engines
die on cue (support.DyingEngine): the crash rule, a dead engine tried again, and the running jobs read by the HTTP
threads changed only under the dispatcher's lock; no engine process."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from support import DyingEngine, died

from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.jobs.dispatch import Dispatcher
from ditto_fast.serve.jobs.queue import JobQueue
from ditto_fast.serve.metrics import Metrics


def _dispatcher(tmp_path: Path, *engines, max_crashes: int = 2) -> tuple[Dispatcher, JobQueue, list[dict]]:
    queue, events = JobQueue(tmp_path / "q.sqlite"), []
    dispatcher = Dispatcher(list(engines), queue, Metrics(queue), events.append, None, None, max_crashes=max_crashes)
    dispatcher.policy = replace(dispatcher.policy, restart_pauses_s=(0.0,))      # its tries, without pauses

    def check(job: dict) -> SimpleNamespace:                # the files' checks are the acceptor's tests'
        request = RenderRequest("ruby", tmp_path / "a.wav", tmp_path / f"{job['id']}.mp4")
        return SimpleNamespace(request=request, audio=None, output=request.output)
    dispatcher.check = check
    return dispatcher, queue, events


def _until(condition, what: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"no {what} within {deadline_s:g} s"
        time.sleep(0.01)


def _waits_in(thread) -> str | None:
    """The function of the package a thread is in now (its innermost frame in ditto_fast)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and "ditto_fast" not in frame.f_code.co_filename:
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else None


def _run(dispatcher: Dispatcher, queue: JobQueue, n: int) -> list[dict]:
    """Submit `n` jobs, run the dispatcher until each is final; the jobs."""
    ids = [queue.submit({"avatar": "ruby"})["id"] for _ in range(n)]
    dispatcher.start()
    try:
        _until(lambda: all(queue.get(i)["status"] in ("done", "failed", "cancelled") for i in ids), "final jobs")
    finally:
        dispatcher.stop(timeout=10)
    return [queue.get(i) for i in ids]


def test_a_job_whose_engine_dies_runs_again_until_max_crashes_and_the_next_one_renders(tmp_path):
    engine = DyingEngine(died(1) + [None] + died(2))
    dispatcher, queue, events = _dispatcher(tmp_path, engine)
    first, second, third = _run(dispatcher, queue, 3)
    assert (first["status"], first["attempts"], first["crashes"]) == ("done", 2, 1)
    assert (second["status"], second["attempts"], second["exit_code"]) == ("failed", 2, 1)
    assert second["error"] == ("killed its engine 2 times (engine-0 its process died (SIGKILL 0), engine-0 its "
                               "process died (SIGKILL 1)); render it alone with `ditto-fast render` to see why")
    assert (third["status"], third["attempts"]) == ("done", 1) and engine.state().restarts == 3
    assert [e["engine"] for e in events if e.get("event") == "engine died"] == ["engine-0"] * 3
    assert dispatcher.running == []


def test_a_server_s_dead_engine_is_tried_again_until_it_starts(tmp_path):
    engine = DyingEngine(died(1), restarts_fail=4)          # more tries than a batch makes: a server goes on
    dispatcher, queue, events = _dispatcher(tmp_path, engine)
    (job,) = _run(dispatcher, queue, 1)
    assert (job["status"], job["attempts"]) == ("done", 2) and engine.state().restarts == 5
    assert len([e for e in events if e.get("event") == "engine down"]) == 4


def test_the_running_jobs_change_only_under_the_dispatcher_s_lock(tmp_path):
    """The HTTP threads read `running` (health, cancel) while dispatch threads change it: a job is marked running
    under the dispatcher's lock, so none starts while another thread holds it."""
    engine = DyingEngine()
    dispatcher, queue, _ = _dispatcher(tmp_path, engine)
    job = queue.submit({"avatar": "ruby"})
    with dispatcher._queued:                                # as cancel() holds it
        dispatcher.start()
        _until(lambda: _waits_in(dispatcher._threads[0]) in ("take", "commit"), "dispatch thread waiting for the lock")
        assert dispatcher.running == [] and engine.rendered == []
    try:
        _until(lambda: queue.get(job["id"])["status"] == "done", "job done")
    finally:
        dispatcher.stop(timeout=10)
    assert dispatcher.running == [] and engine.rendered == [job["id"]]
