"""The job API (FastAPI): submit, look up, list and cancel jobs; health, Prometheus metrics and the OpenAPI
description. Its request model is made from RenderRequest's fields, so the settings stay declared once; a job is
checked (as `render` checks) before it is queued."""

from __future__ import annotations

import hmac
import os
from dataclasses import fields as dataclass_fields
from typing import Any, Optional, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field, create_model

from ditto_fast.avatar.store import avatars_dir
from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.accept import Acceptor
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.queue import STATES, JobQueue, job_view
from ditto_fast.serve.worker import Worker

BODY_LIMIT = 64 << 10           # a job is a few hundred bytes


def job_model() -> type:
    """The POST /v1/jobs body: the render request's fields (help from their declarations) plus priority and
    callback. Every field is taken as given and checked as a job line is, so the refusals are `render`'s."""
    spec: dict[str, Any] = {
        f.name: (Optional[Any], Field(None, description=("Required. " if f.metadata["required"] else "")
                                      + f.metadata["help"]))
        for f in dataclass_fields(RenderRequest)}
    spec["output"] = (Optional[Any], Field(None, description="Required. The output file (a path on the server)."))
    spec["priority"] = (Optional[Union[str, int]], Field(None, description="normal (default), breaking (runs before "
                                                                           "every normal job) or a number"))
    spec["callback"] = (Optional[str], Field(None, description="A URL the finished job's JSON is POSTed to"))
    return create_model("Job", __config__=ConfigDict(extra="allow"), **spec)


JobBody = job_model()


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 before it is read further."""

    def __init__(self, app, limit: int = BODY_LIMIT):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(send, self.limit)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            return await self.app(scope, limited, send)
        except _TooLarge:
            return await _too_large(send, self.limit)


class _TooLarge(Exception):
    pass


async def _too_large(send, limit: int) -> None:
    response = JSONResponse({"error": f"request body over {limit} bytes", "exit_code": UsageError.exit_code},
                            status_code=413)
    await response({"type": "http"}, None, send)


def _error(e: DittoError, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": str(e), "exit_code": e.exit_code}, status_code=status)


def make_app(queue: JobQueue, acceptor: Acceptor, worker: Worker, metrics: Metrics, token: str | None = None,
             engines: dict[str, Any] | None = None) -> FastAPI:
    """The API over one server's queue, acceptor and render threads; with `token`, every /v1 and /metrics request
    needs `Authorization: Bearer TOKEN`. `engines`: what /healthz says of the engines (device, or Ray's actors)."""
    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise _Unauthorised()

    app = FastAPI(title="ditto-fast serve", version="1", description="Lip-synced anchor renders as jobs: one warm "
                  "engine, a durable queue, breaking news first.")
    app.add_middleware(BodyLimit)
    guard = [Depends(authorised)]

    @app.exception_handler(_Unauthorised)
    async def unauthorised(request: Request, exc: _Unauthorised):
        return JSONResponse({"error": "missing or wrong bearer token", "exit_code": 2}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "request body"
        return _error(UsageError(f"{where}: {first.get('msg', 'invalid')}; send one job as a JSON object"))

    @app.post("/v1/jobs", status_code=202, dependencies=guard)
    def submit(job: JobBody):  # type: ignore[valid-type]
        try:
            queued = acceptor.accept(job.model_dump(exclude_unset=True), "request")
        except DittoError as e:
            return _error(e)
        worker.notify()
        worker.log({"job": queued["id"], "state": "queued", "priority": queued["priority"], "output": queued["output"]})
        return {"id": queued["id"], "status": queued["status"]}

    @app.get("/v1/jobs/{job_id}", dependencies=guard)
    def look_up(job_id: str):
        job = queue.get(job_id)
        return job_view(job) if job else JSONResponse({"error": f"no job {job_id}"}, status_code=404)

    @app.get("/v1/jobs", dependencies=guard)
    def list_jobs(status: Optional[str] = None, limit: int = 100):
        if status is not None and status not in STATES:
            return _error(UsageError(f"status must be one of {', '.join(STATES)}"))
        return {"jobs": [job_view(j) for j in queue.list(status, max(1, min(limit, 1000)))]}

    @app.delete("/v1/jobs/{job_id}", dependencies=guard)
    def cancel(job_id: str):
        status = queue.cancel(job_id)
        if status is None:
            return JSONResponse({"error": f"no job {job_id}"}, status_code=404)
        if status == "queued":                  # cancelled now: it never runs
            job = queue.get(job_id)
            worker.ended(job)
            return job_view(job)
        if status == "running":
            worker.cancel(job_id)
            return JSONResponse({**job_view(queue.get(job_id)), "cancel": "requested: stops at the next frame batch"},
                                status_code=202)
        return JSONResponse({"error": f"job {job_id} is {status} already", **job_view(queue.get(job_id))},
                            status_code=409)

    @app.get("/healthz")
    def health():
        store = avatars_dir()
        writable = os.access(store if store.exists() else store.parent, os.W_OK)
        counts = queue.counts()
        body = {"ok": writable, "engine": "loaded", "engines": len(worker.engines), **(engines or {}),
                "queue_depth": counts["queued"], "running": worker.running, "store_writable": writable, "jobs": counts}
        return JSONResponse(body, status_code=200 if writable else 503)

    @app.get("/metrics", dependencies=guard)
    def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class _Unauthorised(Exception):
    pass

