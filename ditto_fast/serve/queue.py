"""The server's durable job queue: one SQLite file under $DITTO_FAST_HOME (WAL, synchronous commits), so a job
accepted is never lost. A job is queued, running, done, failed or cancelled; a server killed at any moment finds
on its next start every job it had accepted, the one it was rendering queued again."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Iterator

STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL = ("done", "failed", "cancelled")
PRIORITIES = {"normal": 0, "breaking": 100}      # a job may also give a number in PRIORITY_RANGE
PRIORITY_RANGE = (-1000, 1000)

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
"""
_ADDED_COLUMNS = {                  # columns of jobs a queue written by an older server lacks
    "watch_files": "TEXT",          # the signatures of the watch folder's audio and sidecar the job took (JSON)
}
_JSON_COLUMNS = ("request", "timings", "progress", "watch_files")


class JobQueue:
    """The jobs of one server (thread-safe: every call opens its own connection)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
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
        with self._db() as db:
            # the job a killed server was rendering: queued again (nothing of it is at its output: renders rename)
            db.execute("UPDATE jobs SET status='queued', progress=NULL, started=NULL WHERE status='running'")

    @contextmanager
    def _db(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A transaction; `durable`: committed to the disk before it returns (NORMAL for a running job's progress,
        which a crash may lose)."""
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
        """The next job to run (highest priority, then oldest), marked running; None if none is queued."""
        with self._db() as db:
            row = db.execute("SELECT id FROM jobs WHERE status='queued' ORDER BY priority DESC, seq LIMIT 1").fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status='running', started=?, attempts=attempts+1 WHERE id=?",
                       (time.time(), row["id"]))
        return self.get(row["id"])

    def finish(self, job_id: str, status: str, **fields: Any) -> dict:
        """Set a job's final (or re-queued) state and any of output, error, exit_code, seconds, timings, skipped."""
        assert status in STATES
        values = {k: json.dumps(v) if k in _JSON_COLUMNS and v is not None else v for k, v in fields.items()}
        if status in FINAL:
            values["finished"] = time.time()
        sets = ", ".join(f"{k}=?" for k in values)
        with self._db() as db:
            db.execute(f"UPDATE jobs SET status=?{', ' + sets if sets else ''} WHERE id=?",
                       (status, *values.values(), job_id))
        return self.get(job_id)

    def set_progress(self, job_id: str, progress: dict) -> None:
        with self._db(durable=False) as db:
            db.execute("UPDATE jobs SET progress=? WHERE id=? AND status='running'", (json.dumps(progress), job_id))

    def cancel(self, job_id: str) -> str | None:
        """Cancel a queued job (it never runs). Returns the status it had (queued: now cancelled; running or final:
        unchanged), None for an unknown id."""
        with self._db() as db:
            row = db.execute("SELECT status FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                return None
            if row["status"] == "queued":
                db.execute("UPDATE jobs SET status='cancelled', finished=?, error=? WHERE id=?",
                           (time.time(), "cancelled before it ran", job_id))
        return row["status"]

    def mark_moved(self, job_id: str) -> None:
        with self._db() as db:
            db.execute("UPDATE jobs SET moved=1 WHERE id=?", (job_id,))

    def get(self, job_id: str) -> dict | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _job(row) if row else None

    def list(self, status: str | None = None, limit: int = 1000) -> list[dict]:
        """Jobs, newest first (of one status when given)."""
        where, args = ("WHERE status=?", (status,)) if status else ("", ())
        with self._db() as db:
            rows = db.execute(f"SELECT * FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [_job(r) for r in rows]

    def watched(self, unmoved_final: bool) -> list[dict]:
        """Watch-folder jobs: final ones whose input is not moved yet, or (False) those queued or running."""
        cond = "status IN ('done','failed','cancelled') AND moved=0" if unmoved_final else \
            "status IN ('queued','running')"
        with self._db() as db:
            rows = db.execute(f"SELECT * FROM jobs WHERE source='watch' AND {cond} ORDER BY seq").fetchall()
        return [_job(r) for r in rows]

    def watched_output(self, output: str) -> list[dict]:
        """Watch-folder jobs that write `output`, newest first."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM jobs WHERE source='watch' AND output=? ORDER BY seq DESC LIMIT 100",
                              (output,)).fetchall()
        return [_job(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """The number of jobs in each state."""
        with self._db() as db:
            rows = db.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetchall()
        found = {r["status"]: r["n"] for r in rows}
        return {s: found.get(s, 0) for s in STATES}


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
            "skipped": bool(job["skipped"]), "attempts": job["attempts"], "created": job["created"],
            "started": job["started"], "finished": job["finished"]}
