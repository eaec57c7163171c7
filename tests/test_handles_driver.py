"""The job driver (handles/driver.py) against a store kept in a list and a handle whose engine dies on cue: what a job
becomes when its engine dies once, every time, or past its time limit, when the store itself fails, and how a dead
engine is started again; no engine process."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from support import DyingEngine, died

from ditto_fast.core.errors import AvatarError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles.base import EngineDied, JobTimedOut
from ditto_fast.handles.driver import Rendering, RetryPolicy, drive

QUICK = RetryPolicy(restart_pauses_s=(0.0,))        # the batch's rule without its pauses between restarts


class Store:
    """A job store in a list: every call recorded as (what, job, detail)."""

    def __init__(self, jobs, finished=(), fail_on: str | None = None):
        self.queue, self.finished, self.fail_on = list(jobs), set(finished), fail_on
        self.deaths: dict[str, list[str]] = {}
        self.said: list[tuple] = []

    def _say(self, *what):
        self.said.append(what)
        if what[0] == self.fail_on:
            raise OSError("disk full")

    def take(self, handle):
        return self.queue.pop(0) if self.queue else None

    def idle(self, handle):
        return False

    def put_back(self, job):
        self._say("put back", job)
        self.queue.insert(0, job)

    def check(self, job):
        if job == "bad":
            raise AvatarError("ruby: not registered")
        return SimpleNamespace(request=RenderRequest("ruby", Path(f"/{job}.wav"), Path(f"/{job}.mp4")), audio=None)

    def skip(self, job, clip, setup):
        return job in self.finished and not self._say("skipped", job)

    def watch(self, job, handle):
        return Rendering(job)

    def preview(self, job, result, clip):
        pass

    def done(self, job, result, seconds):
        self._say("done", job)

    def failed(self, job, error, exit_code, seconds):
        self._say("failed", job, str(error), exit_code)

    def cancelled(self, job, seconds):
        self._say("cancelled", job)

    def died(self, job, cause, policy):
        causes = self.deaths.setdefault(job, [])
        causes.append(cause)
        if policy.again(len(causes)):
            self.queue.insert(0, job)
        else:
            self._say("failed", job, policy.gave_up(causes), 1)

    def let_go(self, job):
        pass

    def lost(self, job, error):
        self._say("lost", job, str(error))

    def engine(self, handle, error, restarted, next_try_s):
        self._say("engine", "restarted" if restarted else "started", None if error is None else str(error),
                  next_try_s)


def test_a_job_whose_engine_dies_once_runs_again_on_a_fresh_engine():
    engine, store = DyingEngine(died(1)), Store(["a", "b"])
    drive(engine, store, QUICK, threading.Event())
    assert engine.rendered == ["a", "b"] and engine.state().restarts == 1
    assert store.said == [("engine", "restarted", None, None), ("done", "a"), ("done", "b")]


def test_a_job_that_kills_its_engine_each_time_fails_naming_each_cause_and_the_next_job_renders():
    engine, store = DyingEngine(died(2)), Store(["a", "b"])
    drive(engine, store, QUICK, threading.Event())
    assert engine.rendered == ["b"] and engine.state().restarts == 2
    failed = [s for s in store.said if s[0] == "failed"]
    assert failed == [("failed", "a", "killed its engine 2 times (engine-0 its process died (SIGKILL 0), engine-0 its "
                       "process died (SIGKILL 1)); render it alone with `ditto-fast render` to see why", 1)]
    assert ("done", "b") in store.said


def test_the_number_of_deaths_a_job_may_cause_is_the_policy_s():
    engine, store = DyingEngine(died(2)), Store(["a"])
    drive(engine, store, RetryPolicy(max_deaths=3, restart_pauses_s=(0.0,)), threading.Event())
    assert engine.rendered == ["a"] and store.said[-1] == ("done", "a")


def test_a_job_past_its_time_limit_fails_once_and_counts_no_death():
    engine, store = DyingEngine([JobTimedOut(600)]), Store(["a", "b"])
    drive(engine, store, QUICK, threading.Event())
    assert store.deaths == {} and engine.rendered == ["b"]
    (failed,) = [s for s in store.said if s[0] == "failed"]
    assert failed[2].startswith("ran past --job-timeout (600 s) and was stopped; it is not run again") and \
        failed[3] == 3


def test_a_refused_job_fails_with_its_line_a_bug_with_an_internal_error_a_finished_one_is_skipped():
    engine, store = DyingEngine([None, KeyError("x")]), Store(["bad", "ok", "buggy", "old"], finished={"old"})
    drive(engine, store, QUICK, threading.Event())
    assert engine.rendered == ["ok"]
    assert store.said[0] == ("failed", "bad", "ruby: not registered", 5)
    assert store.said[2][:2] == ("failed", "buggy") and store.said[2][2].startswith("internal error: KeyError") and \
        store.said[2][3] == 1
    assert store.said[3] == ("skipped", "old")


def test_a_dead_engine_is_tried_again_by_the_policy_then_its_handle_takes_no_more_jobs():
    engine, store = DyingEngine(died(1), restarts_fail=1), Store(["a", "b"])
    drive(engine, store, QUICK, threading.Event())            # the second try starts it: every job renders
    assert engine.rendered == ["a", "b"]
    assert store.said[:2] == [("engine", "restarted", "engine-0: cannot start the engine process", 0.0),
                              ("engine", "restarted", None, None)]
    engine, store = DyingEngine(died(1), restarts_fail=5), Store(["a", "b"])
    drive(engine, store, QUICK, threading.Event())            # three tries fail: the jobs stay in the store
    assert engine.rendered == [] and store.queue == ["a", "b"] and engine.state().restarts == 3
    assert [s[3] for s in store.said if s[0] == "engine"] == [0.0, 0.0, None]


def test_an_engine_is_started_for_a_first_job_that_goes_to_whichever_engine_is_ready_first():
    engine, store = DyingEngine(), Store(["a"])
    drive(engine, store, QUICK, threading.Event(), start=True)
    assert store.said == [("put back", "a"), ("engine", "started", None, None), ("done", "a")]
    engine, store = DyingEngine(start_fails=True), Store(["a"])
    drive(engine, store, QUICK, threading.Event(), start=True)
    assert store.said == [("put back", "a"), ("engine", "started", "engine-0: no checkpoints", None)]
    assert store.queue == ["a"] and engine.rendered == []
    engine, store = DyingEngine(start_fails=True), Store([])
    drive(engine, store, QUICK, threading.Event(), start=True)
    assert store.said == []                                 # nothing to render: no engine started


def test_an_engine_let_go_while_the_store_stops_puts_its_job_back_uncounted():
    stop = threading.Event()
    engine, store = DyingEngine(), Store(["a"])

    def let_go(job, progress=None, commit=None):
        stop.set()
        raise EngineDied("engine-0 was stopped")
    engine.render = let_go
    drive(engine, store, QUICK, stop)
    assert store.said == [("put back", "a")] and store.deaths == {}


def test_the_store_s_own_trouble_is_the_store_s_to_say():
    engine, store = DyingEngine(), Store(["a"], fail_on="done")
    drive(engine, store, QUICK, threading.Event())
    assert store.said[-1] == ("lost", "a", "disk full")


def test_the_policy():
    policy = RetryPolicy()
    assert [policy.again(n) for n in (1, 2)] == [True, False]
    assert [policy.pause(n) for n in range(4)] == [0.0, 5.0, 30.0, None]      # a batch gives up after three tries
    forever = RetryPolicy(restart_pauses_s=(0.0, 5.0, 30.0, 120.0), restart_tries=None)
    assert [forever.pause(n) for n in (0, 3, 50)] == [0.0, 120.0, 120.0]      # a server never does
