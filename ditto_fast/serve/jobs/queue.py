"""The server's durable job queue: one SQLite file under $DITTO_FAST_HOME (WAL, synchronous commits; on a local
disk), so a job accepted is never lost. A job is queued, running, done, failed or cancelled. A running job carries
its server's lease; only that lease moves it on, so no late writer overwrites a final state. A server's next start
finds every job it had accepted: what it was rendering is queued again, or failed once it has killed its engine
`max_crashes` times. A job's final state and its callback (the outbox) are written in one transaction."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Iterator

from ditto_fast.core.errors import EXIT_INTERNAL, one_line
from ditto_fast.handles.base import JOB_STATES
from ditto_fast.handles.driver import RetryPolicy
from ditto_fast.serve.jobs.lease import Lease, lease_alive
from ditto_fast.serve.options import MAX_CRASHES

STATES = tuple(s for s in JOB_STATES if s != "skipped")      # a skipped job is done here, with "skipped": true
FINAL = ("done", "failed", "cancelled")
PRIORITIES = {"normal": 0, "breaking": 100}      # a job may also give a number in PRIORITY_RANGE
PRIORITY_RANGE = (-1000, 1000)
CANCELLED_RUNNING = "cancelled while rendering; nothing was written"
SERVER_DIED = "server died"     # the crash cause of a job whose server was gone at the next start

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,          -- the job line as checked: paths absolute
    source TEXT NOT NULL,           -- api or watch
    watch_path TEXT,                -- the watch folder's file (moved to done/ or failed/ once final)
    moved INTEGER NOT NULL DEFAULT 0,
    callback TEXT,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    output TEXT,
    error TEXT,
    exit_code INTEGER,
    seconds REAL,
    timings TEXT,
    progress TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    skipped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_next ON jobs (status, priority DESC, seq);
CREATE TABLE IF NOT EXISTS leases (
    token TEXT PRIMARY KEY,         -- one opened queue (one server's start)
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started TEXT,                   -- the process's start (lease.process_start)
    heartbeat REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS callbacks (   -- the outbox: a final job's JSON for its callback URL
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    url TEXT NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    due REAL NOT NULL,              -- when it is tried next
    tries INTEGER NOT NULL DEFAULT 0,
    sent REAL,                      -- delivered (a 2xx answer)
    given_up REAL,
    error TEXT                      -- the last try's
);
CREATE INDEX IF NOT EXISTS callbacks_due ON callbacks (sent, given_up, due);
"""
_ADDED_COLUMNS = {                  # columns of jobs a queue written by an older server lacks
    "lease": "TEXT",                # the lease token of the server running it
    "crashes": "INTEGER NOT NULL DEFAULT 0",    # how often its engine (or server) died under it
    "crash_causes": "TEXT",         # their causes (JSON list)
    "cancel_requested": "INTEGER NOT NULL DEFAULT 0",
    "watch_files": "TEXT",          # the signatures of the watch folder's audio and sidecar the job took (JSON)
}
_JSON_COLUMNS = ("request", "timings", "progress", "crash_causes", "watch_files")


class JobQueue:
    """The jobs of one server, held under `lease` (default: a new one for this process). Thread-safe: every call
    opens its own connection."""

    def __init__(self, path: str | Path, lease: Lease | None = None):
        self.path = Path(path)
        self.lease = lease or Lease.this_process()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")       # kept by the file: readers never wait for the writer
            db.executescript(_SCHEMA)
            columns = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
            if "profile" in columns:            # a queue written before the stage timings were called timings
                db.execute("ALTER TABLE jobs RENAME COLUMN profile TO timings")
            for name, declaration in _ADDED_COLUMNS.items():
                if name not in columns:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
        self.heartbeat()

    @contextmanager
    def _db(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction; `durable`: committed to the disk before it returns (NORMAL for a running job's
        progress and the heartbeat, which a crash may lose)."""
        with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """A read (one statement: one snapshot; it waits for no writer)."""
        with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.row_factory = sqlite3.Row
            return db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------------- the server's lease
    def heartbeat(self) -> None:
        """Refresh this queue's lease (a server calls it every few seconds: lease.Heartbeat)."""
        lease = self.lease
        with self._db(durable=False) as db:
            db.execute("INSERT INTO leases (token, host, pid, started, heartbeat) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT(token) DO UPDATE SET heartbeat=excluded.heartbeat",
                       (lease.token, lease.host, lease.pid, lease.started, time.time()))

    def recover(self, max_crashes: int = MAX_CRASHES) -> list[dict]:
        """At a server's start: each running job whose lease is dead counts a crash (its server died under it) and
        is queued again, failed (`max_crashes` reached) or cancelled (a cancel was asked); returns those jobs. Jobs
        a live server holds are left alone."""
        changed = []
        with self._db() as db:
            leases = {r["token"]: r for r in db.execute("SELECT * FROM leases")}
            dead = {t for t, r in leases.items()
                    if t != self.lease.token and not lease_alive(r["host"], r["pid"], r["started"], r["heartbeat"])}
            for row in db.execute("SELECT * FROM jobs WHERE status='running'").fetchall():
                if row["lease"] in leases and row["lease"] not in dead:
                    continue
                changed.append(self._crashed(db, row, SERVER_DIED, max_crashes))
            db.executemany("DELETE FROM leases WHERE token=?", [(t,) for t in dead])
        return changed

    # ------------------------------------------------------------------------- jobs
    def submit(self, request: dict, *, priority: int = 0, source: str = "api", callback: str | None = None,
               watch_path: str | None = None, output: str | None = None, watch_files: dict | None = None) -> dict:
        """Queue a checked request (a job line, paths absolute); returns the job. A watch folder's job carries its
        file (`watch_path`) and the signatures of the files it took (`watch_files`)."""
        job_id = uuid.uuid4().hex[:16]
        with self._db() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            db.execute("INSERT INTO jobs (id, seq, priority, status, request, source, watch_path, callback, created, "
                       "output, watch_files) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
                       (job_id, seq, priority, json.dumps(request), source, watch_path, callback, time.time(), output,
                        None if watch_files is None else json.dumps(watch_files)))
        return self.get(job_id)

    def take(self) -> dict | None:
        """The next job to run (highest priority, then oldest), marked running under this queue's lease (one more
        attempt, no progress yet); None if none is queued."""
        with self._db() as db:
            row = db.execute("SELECT id FROM jobs WHERE status='queued' ORDER BY priority DESC, seq LIMIT 1").fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status='running', started=?, attempts=attempts+1, lease=?, progress=NULL "
                       "WHERE id=?", (time.time(), self.lease.token, row["id"]))
            taken = db.execute("SELECT * FROM jobs WHERE id=?", (row["id"],)).fetchone()
        return _job(taken)          # read in the same transaction: a job marked running always has its taker

    def finish(self, job_id: str, status: str, **fields: Any) -> dict | None:
        """End a job this lease runs: `status` done, failed or cancelled, with any of output, error, exit_code,
        seconds, timings, skipped; its callback goes to the outbox. None (nothing changed) if the job is not
        running under this lease: a late writer never overwrites a final state."""
        if status not in FINAL:
            raise ValueError(f"finish: {status!r} is not a final state")
        values = {k: json.dumps(v) if k in _JSON_COLUMNS and v is not None else v for k, v in fields.items()}
        with self._db() as db:
            if not self._held(db, job_id):
                return None
            return self._end(db, job_id, status, values)

    def requeue(self, job_id: str) -> dict | None:
        """Queue again a job this lease runs (the server stops): it runs anew, its progress cleared; None if the job
        is not running under this lease."""
        with self._db() as db:
            if not self._held(db, job_id):
                return None
            db.execute("UPDATE jobs SET status='queued', started=NULL, progress=NULL, lease=NULL WHERE id=?",
                       (job_id,))
        return self.get(job_id)

    def engine_died(self, job_id: str, cause: str, max_crashes: int = MAX_CRASHES) -> dict | None:
        """The engine died under a job this lease runs (`cause`: SIGKILL, SIGSEGV, out of memory, ...): counted, and
        the job queued again, failed once it has killed its engine `max_crashes` times, or cancelled if a cancel
        was asked. Returns the job (its status says which), None if not running under this lease."""
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=? AND status='running' AND lease=?",
                             (job_id, self.lease.token)).fetchone()
            return None if row is None else self._crashed(db, row, cause, max_crashes)

    def set_progress(self, job_id: str, progress: dict) -> bool:
        """Record a running job's progress; False (nothing written) unless this lease runs it."""
        with self._db(durable=False) as db:
            return db.execute("UPDATE jobs SET progress=? WHERE id=? AND status='running' AND lease=?",
                              (json.dumps(progress), job_id, self.lease.token)).rowcount == 1

    def cancel(self, job_id: str) -> str | None:
        """Cancel a job: a queued one now (it never runs); a running one is marked (`cancel_requested`: its
        renderer stops at the next frame batch, and a restart ends it cancelled). Returns the status it had (final
        ones are unchanged), None for an unknown id."""
        with self._db() as db:
            row = db.execute("SELECT status FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                return None
            if row["status"] == "queued":
                self._end(db, job_id, "cancelled", {"error": "cancelled before it ran"})
            elif row["status"] == "running":
                db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))
        return row["status"]

    def cancel_requested(self, job_id: str) -> bool:
        """Whether a cancel was asked for this job (cheap: a renderer asks at each progress tick)."""
        rows = self._rows("SELECT cancel_requested FROM jobs WHERE id=?", (job_id,))
        return bool(rows and rows[0]["cancel_requested"])

    def mark_moved(self, job_id: str) -> None:
        with self._db() as db:
            db.execute("UPDATE jobs SET moved=1 WHERE id=?", (job_id,))

    def get(self, job_id: str) -> dict | None:
        rows = self._rows("SELECT * FROM jobs WHERE id=?", (job_id,))
        return _job(rows[0]) if rows else None

    def list(self, status: str | None = None, limit: int = 1000) -> list[dict]:
        """Jobs, newest first (of one status when given)."""
        where, args = ("WHERE status=?", (status,)) if status else ("", ())
        return [_job(r) for r in self._rows(f"SELECT * FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*args, limit))]

    def watched(self, unmoved_final: bool) -> list[dict]:
        """Watch-folder jobs: final ones whose input is not moved yet, or (False) those queued or running."""
        cond = "status IN ('done','failed','cancelled') AND moved=0" if unmoved_final else \
            "status IN ('queued','running')"
        return [_job(r) for r in self._rows(f"SELECT * FROM jobs WHERE source='watch' AND {cond} ORDER BY seq")]

    def watched_output(self, output: str) -> list[dict]:
        """Watch-folder jobs that write `output`, newest first."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM jobs WHERE source='watch' AND output=? ORDER BY seq DESC LIMIT 100",
                              (output,)).fetchall()
        return [_job(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """The number of jobs in each state."""
        found = {r["status"]: r["n"] for r in self._rows("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status")}
        return {s: found.get(s, 0) for s in STATES}

    # ------------------------------------------------------------------------- the callbacks' outbox
    def callbacks_due(self, now: float | None = None, limit: int = 20) -> list[dict]:
        """Callbacks neither delivered nor given up whose next try is due, oldest first."""
        rows = self._rows("SELECT * FROM callbacks WHERE sent IS NULL AND given_up IS NULL AND due<=? "
                          "ORDER BY due, id LIMIT ?", (time.time() if now is None else now, limit))
        return [dict(r) for r in rows]

    def next_callback_due(self) -> float | None:
        """When the next pending callback is due (None: none pending)."""
        return self._rows("SELECT MIN(due) AS due FROM callbacks WHERE sent IS NULL AND given_up IS NULL")[0]["due"]

    def callback_tried(self, callback_id: int, error: str | None, retry_at: float | None = None) -> None:
        """Record one try of a callback: delivered (`error` None), to be tried again at `retry_at`, or given up."""
        now = time.time()
        with self._db() as db:
            if error is None:
                db.execute("UPDATE callbacks SET tries=tries+1, sent=?, error=NULL WHERE id=?", (now, callback_id))
            else:
                db.execute("UPDATE callbacks SET tries=tries+1, error=?, due=COALESCE(?, due), given_up=? WHERE id=?",
                           (error, retry_at, None if retry_at is not None else now, callback_id))

    def callbacks_of(self, job_id: str) -> list[dict]:
        """A job's callback deliveries (tries, sent, given up, last error)."""
        return [dict(r) for r in self._rows("SELECT * FROM callbacks WHERE job=? ORDER BY id", (job_id,))]

    # ------------------------------------------------------------------------- inside a transaction
    def _held(self, db: sqlite3.Connection, job_id: str) -> bool:
        return db.execute("SELECT 1 FROM jobs WHERE id=? AND status='running' AND lease=?",
                          (job_id, self.lease.token)).fetchone() is not None

    def _end(self, db: sqlite3.Connection, job_id: str, status: str, values: dict) -> dict:
        """Set a job's final state and `values`; its callback into the outbox (the same transaction)."""
        values = {**values, "finished": time.time()}
        db.execute(f"UPDATE jobs SET status=?, {', '.join(f'{k}=?' for k in values)} WHERE id=?",
                   (status, *values.values(), job_id))
        job = _job(db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone())
        if job["callback"]:
            db.execute("INSERT INTO callbacks (job, url, body, created, due) VALUES (?, ?, ?, ?, ?)",
                       (job_id, job["callback"], json.dumps(job_view(job)), job["finished"], job["finished"]))
        return job

    def _crashed(self, db: sqlite3.Connection, row: sqlite3.Row, cause: str, max_crashes: int) -> dict:
        """Count a crash under a running job, then queue it again, fail it or (a cancel asked) cancel it."""
        crashes = row["crashes"] + 1
        causes = [*json.loads(row["crash_causes"] or "[]"), one_line(cause, 200)]
        db.execute("UPDATE jobs SET crashes=?, crash_causes=? WHERE id=?", (crashes, json.dumps(causes), row["id"]))
        if row["cancel_requested"]:
            return self._end(db, row["id"], "cancelled", {"error": CANCELLED_RUNNING})
        policy = RetryPolicy(max_deaths=max_crashes)           # the job driver's rule, a server's death counted
        if not policy.again(crashes):
            return self._end(db, row["id"], "failed", {"exit_code": EXIT_INTERNAL, "error": policy.gave_up(causes)})
        db.execute("UPDATE jobs SET status='queued', started=NULL, progress=NULL, lease=NULL WHERE id=?", (row["id"],))
        return _job(db.execute("SELECT * FROM jobs WHERE id=?", (row["id"],)).fetchone())


def _job(row: sqlite3.Row) -> dict:
    job = dict(row)
    for k in _JSON_COLUMNS:
        job[k] = json.loads(job[k]) if job[k] is not None else None
    return job


def job_view(job: dict) -> dict:
    """A job as the API returns it (and as a callback receives it)."""
    return {"id": job["id"], "status": job["status"], "priority": job["priority"], "source": job["source"],
            "request": job["request"], "progress": job["progress"], "output": job["output"], "error": job["error"],
            "exit_code": job["exit_code"], "seconds": job["seconds"], "timings": job["timings"],
            "skipped": bool(job["skipped"]), "attempts": job["attempts"], "crashes": job["crashes"],
            "crash_causes": job["crash_causes"] or [], "cancel_requested": bool(job["cancel_requested"]), "created": job["created"], "started": job["started"],
            "finished": job["finished"]}
