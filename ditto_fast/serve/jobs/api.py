"""The job routes of the API: submit (POST /v1/jobs), look up, list and cancel. The request model is made from
RenderRequest's fields, so the settings stay declared once; a job is checked (as `render` checks) before it is
queued."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any, Callable, Optional

from fastapi import FastAPI
from pydantic import ConfigDict, Field, create_model

from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.answers import Answer, busy, error, refusal
from ditto_fast.serve.decoded import DecodersBusy
from ditto_fast.serve.jobs.accept import Acceptor
from ditto_fast.serve.jobs.dispatch import Dispatcher
from ditto_fast.serve.jobs.queue import STATES, JobQueue, job_view


def job_model() -> type:
    """The POST /v1/jobs body: the render request's fields (help from their declarations) plus priority, callback
    and overwrite. Every field is taken as given and checked as a job line is, so the refusals are `render`'s (a
    `"priority": true` is refused, not read as 1)."""
    spec: dict[str, Any] = {
        f.name: (Optional[Any], Field(None, description=("Required. " if f.metadata["required"] else "")
                                      + f.metadata["help"]))
        for f in dataclass_fields(RenderRequest)}
    spec["output"] = (Optional[Any], Field(None, description="Required. The output file (a path on the server)."))
    spec["priority"] = (Optional[Any], Field(None, description="normal (default), breaking (runs before every normal "
                                                               "job) or a whole number"))
    spec["callback"] = (Optional[Any], Field(None, description="A URL the finished job's JSON is POSTed to"))
    spec["overwrite"] = (Optional[Any], Field(None, description="true: replace an existing output that is not this "
                                                                "request's render (refused otherwise)"))
    return create_model("Job", __config__=ConfigDict(extra="allow"), **spec)


JobBody = job_model()


def add_job_routes(app: FastAPI, queue: JobQueue, acceptor: Acceptor, dispatcher: Dispatcher,
                   links: Callable[[dict], dict], live: Any = None) -> None:
    """The job routes on `app`: `links` adds a job's links to its view (the page's preview and output); `live`: the
    live sessions, listed beside the jobs (their `list()`'s views)."""

    @app.post("/v1/jobs", status_code=202)
    def submit(job: JobBody):  # type: ignore[valid-type]
        try:
            queued = acceptor.accept(job.model_dump(exclude_unset=True), "request")
        except DecodersBusy as e:
            return busy(e)
        except DittoError as e:
            return error(e)
        dispatcher.notify()
        dispatcher.log({"job": queued["id"], "state": "queued", "priority": queued["priority"],
                        "output": queued["output"]})
        return {"id": queued["id"], "status": queued["status"]}

    @app.get("/v1/jobs/{job_id}")
    def look_up(job_id: str):
        job = queue.get(job_id)
        return links(job_view(job)) if job else refusal(f"no job {job_id}", 404)

    @app.get("/v1/jobs")
    def list_jobs(status: Optional[str] = None, limit: int = 100):
        if status is not None and status not in STATES:
            return error(UsageError(f"status must be one of {', '.join(STATES)}"))
        jobs = {"jobs": [links(job_view(j)) for j in queue.list(status, max(1, min(limit, 1000)))]}
        return {**jobs, "live": [s.view() for s in live.list()]} if live is not None else jobs

    @app.delete("/v1/jobs/{job_id}")
    def cancel(job_id: str):
        status = queue.cancel(job_id)
        if status is None:
            return refusal(f"no job {job_id}", 404)
        if status == "queued":                  # cancelled now: it never runs
            job = queue.get(job_id)
            dispatcher.ended(job)
            return job_view(job)
        if status == "running" and dispatcher.cancel(job_id):
            return Answer({**job_view(queue.get(job_id)), "cancel": "requested: it stops at its next frame batch, "
                           "or before its finished output is renamed into place"}, status_code=202)
        if status == "running":
            return Answer({"error": f"job {job_id} is finishing: its output is complete and being renamed into place; "
                                    "too late to cancel (delete the output once it is done)",
                           "exit_code": UsageError.exit_code, "job": job_view(queue.get(job_id))}, status_code=409)
        return Answer({"error": f"job {job_id} is {status} already; there is nothing to cancel",
                       "exit_code": UsageError.exit_code, "job": job_view(queue.get(job_id))}, status_code=409)
