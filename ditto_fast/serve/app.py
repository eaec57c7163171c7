"""The API (FastAPI): one app over a server's rooms: the job routes (serve/jobs/api.py), the live sessions' routes
and WebSocket (serve/live/api.py), the newsroom page and its routes (serve/page/api.py); here health, Prometheus
metrics and the OpenAPI description (/openapi.json; no /docs page, whose scripts would come from the internet).
Every refusal is `{"error", "exit_code"}` (serve/answers.py): a bad job, an unknown route, a body over the limit
however it is sent, a foreign Host or Origin and a missing token (checked before a body is read: serve/auth.py) and
an internal error alike."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from ditto_fast.avatar.store import avatars_dir
from ditto_fast.core.errors import EXIT_INTERNAL, UsageError
from ditto_fast.core.files import printable
from ditto_fast.serve.answers import Answer, error, refusal
from ditto_fast.serve.auth import SAME_ORIGIN, RequestGate, bearer_matches
from ditto_fast.serve.health import engine_view
from ditto_fast.serve.hosts import AllowedHosts
from ditto_fast.serve.jobs.accept import Acceptor
from ditto_fast.serve.jobs.api import add_job_routes
from ditto_fast.serve.jobs.dispatch import Dispatcher
from ditto_fast.serve.jobs.queue import JobQueue
from ditto_fast.serve.metrics import Metrics
from ditto_fast.serve.page.api import PAGE_FILES, UPLOAD_PATH, PageFiles, add_page_routes, job_links

OPEN_PATHS = ("/healthz", "/openapi.json", *PAGE_FILES)      # answered without the token (the page shows nothing
#                                                             until it has the token)


def make_app(queue: JobQueue, acceptor: Acceptor, dispatcher: Dispatcher, metrics: Metrics, token: str | None = None,
             engines: dict[str, Any] | None = None, watch: Any = None, live: Any = None,
             files: PageFiles | None = None, hosts: AllowedHosts | None = None) -> FastAPI:
    """The API over one server's queue, acceptor and dispatch threads; with `token`, every request but /healthz and
    /openapi.json needs `Authorization: Bearer TOKEN`. `engines`: what /healthz says of the engines beside their
    states (the device, or Ray's address); `watch`: the watch folder, whose thread /healthz watches too; `live`: the
    live sessions (serve/live/sessions.py), whose routes are added (serve/live/api.py); `files`: where the newsroom
    page's uploads and previews go (serve/page/api.py; default: uploads/ under the first root, previews under the
    home); `hosts`: the Host names it answers to (serve/hosts.py; None: any, a browser's Origin then checked against
    the request's own Host)."""
    app = FastAPI(title="ditto-fast serve", version="1", description="Lip-synced anchor renders as jobs: one warm "
                  "engine, a durable queue, breaking news first.", docs_url=None, redoc_url=None,
                  default_response_class=Answer)
    app.add_middleware(RequestGate, token=token, open_paths=OPEN_PATHS, streamed=(UPLOAD_PATH,), hosts=hosts)
    if files is None:
        from ditto_fast.core.home import store_root

        files = PageFiles(acceptor.roots, acceptor.roots[0] / "uploads", store_root() / "serve" / "previews")

    @app.exception_handler(HTTPException)
    async def http_refusal(request: Request, exc: HTTPException):
        where = f"{request.method} {printable(request.url.path)}"
        message = {404: f"{where}: no such route; the routes are described at /openapi.json",
                   405: f"{where}: method not allowed here; the routes are described at /openapi.json"}
        return refusal(message.get(exc.status_code, f"{where}: {exc.detail}"), exc.status_code,
                       headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return error(UsageError(f"request body: not valid JSON ({(first.get('ctx') or {}).get('error', '?')}); "
                                    "send one job as a JSON object"))
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "request body"
        return error(UsageError(f"{where}: {first.get('msg', 'invalid')}; send one job as a JSON object"))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return refusal(f"internal error: {type(exc).__name__}; the server's log has the details", 500, EXIT_INTERNAL,
                       headers={k.decode(): v.decode() for k, v in SAME_ORIGIN})   # sent outside the RequestGate

    add_job_routes(app, queue, acceptor, dispatcher, lambda view: job_links(view, files), live)

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
        body = {"ok": ok, **(engines or {}), "engines": [engine_view(e) for e in engine_health["engines"]],
                "store_writable": writable,
                "watch": None if watch is None else {"alive": watch.alive, "last_poll": watch.last_poll},
                "queue_depth": counts["queued"] if counts else None, "running": dispatcher.running, "jobs": counts,
                **({"live": {**live.counts(), "sessions": live.carried()}} if live is not None else {})}
        return Answer(body, status_code=status)

    if live is not None:
        from ditto_fast.serve.live.api import add_live_routes

        add_live_routes(app, live, token, Answer, refusal, error)

    add_page_routes(app, queue.get, files, refusal, error, acceptor.decoded)

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
