"""The server's Prometheus metrics (prometheus_client): jobs by state, frames and seconds by stage, the queue's
depth, each job's turnaround (accepted to final) and attempts, the crashes under jobs (an engine or the server that
died while rendering one) by what became of the job, each engine's restarts and whether it can render, and the
live sessions by state and their frames."""

from __future__ import annotations

from typing import Callable, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TURNAROUND_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
ATTEMPT_BUCKETS = (1, 2, 3, 5, 10)


class Counted(Protocol):
    """What the metrics read of the queue (jobs/queue.py's JobQueue): the number of jobs in each state."""

    def counts(self) -> dict[str, int]: ...


class Metrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self, queue: Counted):
        self.queue = queue
        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("ditto_fast_jobs", "Jobs in the queue by state", ["state"], registry=r)
        self.depth = Gauge("ditto_fast_queue_depth", "Jobs waiting to run", registry=r)
        self.finished = Counter("ditto_fast_jobs_finished", "Jobs that reached a final state since start",
                                ["state"], registry=r)
        self.frames = Counter("ditto_fast_frames", "Frames rendered since start", registry=r)
        self.stage_seconds = Counter("ditto_fast_stage_seconds", "Wall seconds spent in each render stage",
                                     ["stage"], registry=r)
        self.turnaround = Histogram("ditto_fast_turnaround_seconds", "Seconds from a job's acceptance to its end",
                                    buckets=TURNAROUND_BUCKETS, registry=r)
        self.attempts = Histogram("ditto_fast_job_attempts", "Runs a job was given (attempts) by the time it ended",
                                  buckets=ATTEMPT_BUCKETS, registry=r)
        self.crashes = Counter("ditto_fast_job_crashes", "Engines (or servers) that died under a job since start, by "
                               "what became of the job: queued again, failed or cancelled", ["outcome"], registry=r)
        self.restarts = Counter("ditto_fast_engine_restarts", "Engines started again since start (after one died)",
                                ["engine"], registry=r)
        self.engines_up = Gauge("ditto_fast_engine_up", "1 when the engine can render (idle or busy), else 0",
                                ["engine"], registry=r)
        self.live = Gauge("ditto_fast_live_sessions", "Live sessions by state", ["state"], registry=r)
        self.live_frames = Gauge("ditto_fast_live_frames", "Frames of the live sessions since start, by what became "
                                 "of them (sent, on_time, repeated, skipped, late)", ["kind"], registry=r)
        self.engine_states: Callable[[], list[dict]] | None = None     # the dispatcher's, read at each scrape
        self.live_sessions = None               # the server's LiveSessions, read at each scrape

    def rendered(self, timings: dict) -> None:
        self.frames.inc(timings["frames"])
        for stage, seconds in timings["stages"].items():
            self.stage_seconds.labels(stage).inc(seconds)

    def ended(self, job: dict) -> None:
        self.finished.labels(job["status"]).inc()
        if job["finished"] is not None:
            self.turnaround.observe(job["finished"] - job["created"])
        if job["attempts"]:
            self.attempts.observe(job["attempts"])

    def crashed(self, job: dict) -> None:
        """An engine (or server) died under `job`, which is now queued again, failed or cancelled."""
        self.crashes.labels(job["status"]).inc()

    def engine_restarted(self, name: str) -> None:
        self.restarts.labels(name).inc()

    def exposition(self) -> bytes:
        """The text format, with the queue's counts and the engines' states read now."""
        for state in self.engine_states() if self.engine_states else ():
            self.engines_up.labels(state["name"]).set(1 if state["state"] in ("idle", "busy") else 0)
        if self.live_sessions is not None:
            for state, n in self.live_sessions.counts().items():
                self.live.labels(state).set(n)
            for kind, n in self.live_sessions.frames().items():
                self.live_frames.labels(kind).set(n)
        counts = self.queue.counts()        # every state of a job, in the queue's order
        for state, n in counts.items():
            self.jobs.labels(state).set(n)
        self.depth.set(counts["queued"])
        return generate_latest(self.registry)
