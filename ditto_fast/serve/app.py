"""The job API (FastAPI): submit, look up, list and cancel jobs; health, Prometheus metrics and the OpenAPI
description (/openapi.json; no /docs page, whose scripts would come from the internet); the newsroom page and its
routes (serve/page_api.py). Its request model is made
from RenderRequest's fields, so the settings stay declared once; a job is checked (as `render` checks) before it
is queued. Every refusal is `{"error", "exit_code"}`: a bad job, an unknown route, a body over the limit however it
is sent, a missing token (checked before a body is read) and an internal error alike."""

from __future__ import annotations

import hmac
import os
from dataclasses import fields as dataclass_fields
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field, create_model
from starlette.exceptions import HTTPException

from ditto_fast.avatar.store import avatars_dir
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, UsageError
from ditto_fast.core.files import printable
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.jobs.accept import Acceptor
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.jobs.queue import STATES, JobQueue, job_view
from ditto_fast.serve.jobs.dispatch import Dispatcher
from ditto_fast.serve.page.api import PAGE_FILES, UPLOAD_PATH, PageFiles, add_page_routes, job_links

BODY_LIMIT = 64 << 10           # a job is a few hundred bytes
DRAIN_LIMIT = 64 << 20          # a refused body is read (and dropped) up to this, so its client sees the answer
OPEN_PATHS = ("/healthz", "/openapi.json", *PAGE_FILES)      # answered without the token (the page shows nothing
#                                                             until it has the token)


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


def bearer_matches(header: bytes, token: str) -> bool:
    """Whether an Authorization header carries `token` (the scheme Bearer in any case; compared in constant time)."""
    scheme, _, given = header.partition(b" ")
    return hmac.compare_digest(given, token.encode()) and scheme.lower() == b"bearer"


def readable(value: Any) -> Any:
    """A JSON value with its text made writable as UTF-8 (a file name's other bytes shown as \\xNN: a job an older
    server stored with such a name still lists)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [readable(v) for v in value]
    return value


class Answer(JSONResponse):
    """The API's JSON answers, readable whatever text a stored job holds."""

    def render(self, content: Any) -> bytes:
        return super().render(readable(content))


def _refusal(message: str, status: int, exit_code: int = UsageError.exit_code,
             headers: dict[str, str] | None = None) -> Answer:
    return Answer({"error": message, "exit_code": exit_code}, status_code=status, headers=headers)


class RequestGate:
    """ASGI middleware before every route: with a token, a request without it is 401 before its body is read or
    parsed; then the body is read whole, at most `limit` bytes (413 over it, with Content-Length or chunked). A
    refused request's body is read on to its end (up to DRAIN_LIMIT) and dropped, so that its client gets the
    answer rather than a reset connection. An upload's body (UPLOAD_PATH) is passed on as it comes: its route
    streams it to a file under its own limit."""

    def __init__(self, app, token: str | None = None, limit: int = BODY_LIMIT):
        self.app, self.token, self.limit = app, token, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            if not bearer_matches(dict(scope["headers"]).get(b"authorization", b""), self.token):
                await _drain(receive)
                return await _refusal("missing or wrong bearer token", 401,
                                      headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        if scope["path"] == UPLOAD_PATH and scope["method"] == "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":       # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                if more:
                    await _drain(receive, len(body))
                return await _refusal(f"request body over {self.limit >> 10} KiB; a job is one small JSON object",
                                      413)(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _drain(receive, seen: int = 0) -> None:
    """Read and drop the rest of a request's body (up to DRAIN_LIMIT bytes in all)."""
    while seen <= DRAIN_LIMIT:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


def _error(e: DittoError, status: int = 400) -> Answer:
    return _refusal(str(e), status, e.exit_code)


def make_app(queue: JobQueue, acceptor: Acceptor, dispatcher: Dispatcher, metrics: Metrics, token: str | None = None,
             engines: dict[str, Any] | None = None, watch: Any = None, live: Any = None,
             files: PageFiles | None = None) -> FastAPI:
    """The API over one server's queue, acceptor and dispatch threads; with `token`, every request but /healthz and
    /openapi.json needs `Authorization: Bearer TOKEN`. `engines`: what /healthz says of the engines beside their
    states (the device, or Ray's address); `watch`: the watch folder, whose thread /healthz watches too; `live`: the
    live sessions (serve/live_sessions.py), whose routes are added (serve/live_api.py); `files`: where the newsroom
    page's uploads and previews go (serve/page_api.py; default: uploads/ under the first root, previews under the
    home)."""
    app = FastAPI(title="ditto-fast serve", version="1", description="Lip-synced anchor renders as jobs: one warm "
                  "engine, a durable queue, breaking news first.", docs_url=None, redoc_url=None,
                  default_response_class=Answer)
    app.add_middleware(RequestGate, token=token)
    if files is None:
        from ditto_fast.core.home import store_root

        files = PageFiles(acceptor.roots, acceptor.roots[0] / "uploads", store_root() / "serve" / "previews")

    @app.exception_handler(HTTPException)
    async def http_refusal(request: Request, exc: HTTPException):
        where = f"{request.method} {printable(request.url.path)}"
        message = {404: f"{where}: no such route; the routes are described at /openapi.json",
                   405: f"{where}: method not allowed here; the routes are described at /openapi.json"}
        return _refusal(message.get(exc.status_code, f"{where}: {exc.detail}"), exc.status_code,
                        headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(UsageError(f"request body: not valid JSON ({(first.get('ctx') or {}).get('error', '?')}); "
                                     "send one job as a JSON object"))
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "request body"
        return _error(UsageError(f"{where}: {first.get('msg', 'invalid')}; send one job as a JSON object"))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return _refusal(f"internal error: {type(exc).__name__}; the server's log has the details", 500, EXIT_INTERNAL)

    @app.post("/v1/jobs", status_code=202)
    def submit(job: JobBody):  # type: ignore[valid-type]
        try:
            queued = acceptor.accept(job.model_dump(exclude_unset=True), "request")
        except DittoError as e:
            return _error(e)
        dispatcher.notify()
        dispatcher.log({"job": queued["id"], "state": "queued", "priority": queued["priority"],
                        "output": queued["output"]})
        return {"id": queued["id"], "status": queued["status"]}

    @app.get("/v1/jobs/{job_id}")
    def look_up(job_id: str):
        job = queue.get(job_id)
        return job_links(job_view(job), files) if job else _refusal(f"no job {job_id}", 404)

    @app.get("/v1/jobs")
    def list_jobs(status: Optional[str] = None, limit: int = 100):
        if status is not None and status not in STATES:
            return _error(UsageError(f"status must be one of {', '.join(STATES)}"))
        jobs = {"jobs": [job_links(job_view(j), files) for j in queue.list(status, max(1, min(limit, 1000)))]}
        return {**jobs, "live": [s.view() for s in live.list()]} if live is not None else jobs

    @app.delete("/v1/jobs/{job_id}")
    def cancel(job_id: str):
        status = queue.cancel(job_id)
        if status is None:
            return _refusal(f"no job {job_id}", 404)
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

    @app.get("/healthz")
    def health(request: Request):
        """Up (200) when an engine can render, the store is writable and the watch folder's thread runs; else 503.
        Only that without the token; with it (or with no token set), each engine's state and the queue."""
        store = avatars_dir()
        writable = os.access(store if store.exists() else store.parent, os.W_OK)
        engine_health = dispatcher.health()
        watching = watch is None or watch.alive
        ok = writable and engine_health["ok"] and watching
        status = 200 if ok else 503
        if token is not None and not bearer_matches(request.headers.get("authorization", "").encode(), token):
            return Answer({"ok": ok}, status_code=status)
        try:
            counts = queue.counts()
        except Exception:  # noqa: BLE001 - the database locked past its timeout: say so, stay up
            counts = None
        body = {"ok": ok, **(engines or {}), "engines": engine_health["engines"], "store_writable": writable,
                "watch": None if watch is None else {"alive": watch.alive, "last_poll": watch.last_poll},
                "queue_depth": counts["queued"] if counts else None, "running": dispatcher.running, "jobs": counts,
                **({"live": live.counts()} if live is not None else {})}
        return Answer(body, status_code=status)

    if live is not None:
        from ditto_fast.serve.live.api import add_live_routes

        add_live_routes(app, live, token, Answer, _refusal, _error)

    add_page_routes(app, queue, files, _refusal, _error, acceptor.decoded)

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
