"""The API's door: the bearer token, checked before a body is read, and the body read whole up to a limit (a refused
body drained so that its client gets the answer)."""

from __future__ import annotations

import hmac
from typing import Collection

from ditto_fast.serve.answers import refusal

BODY_LIMIT = 64 << 10           # a job is a few hundred bytes
DRAIN_LIMIT = 64 << 20          # a refused body is read (and dropped) up to this, so its client sees the answer


def bearer_matches(header: bytes, token: str) -> bool:
    """Whether an Authorization header carries `token` (the scheme Bearer in any case; compared in constant time)."""
    scheme, _, given = header.partition(b" ")
    return hmac.compare_digest(given, token.encode()) and scheme.lower() == b"bearer"


class RequestGate:
    """ASGI middleware before every route: with a token, a request without it is 401 before its body is read or
    parsed (but on `open_paths`); then the body is read whole, at most `limit` bytes (413 over it, with
    Content-Length or chunked). A refused request's body is read on to its end (up to DRAIN_LIMIT) and dropped, so
    that its client gets the answer rather than a reset connection. A POST to one of `streamed` (an upload) is passed
    on as it comes: its route streams the body to a file under its own limit."""

    def __init__(self, app, token: str | None = None, limit: int = BODY_LIMIT, open_paths: Collection[str] = (),
                 streamed: Collection[str] = ()):
        self.app, self.token, self.limit = app, token, limit
        self.open_paths, self.streamed = open_paths, streamed

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.token is not None and scope["path"] not in self.open_paths:
            if not bearer_matches(dict(scope["headers"]).get(b"authorization", b""), self.token):
                await _drain(receive)
                return await refusal("missing or wrong bearer token", 401,
                                     headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        if scope["path"] in self.streamed and scope["method"] == "POST":
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
                return await refusal(f"request body over {self.limit >> 10} KiB; a job is one small JSON object",
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
