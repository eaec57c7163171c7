"""The API's door: the Host and a browser's Origin (serve/hosts.py), the bearer token, each checked before a body is
read, and the body read whole up to a limit (a refused body drained so that its client gets the answer), at a pace
(a body that trickles in is cut off)."""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Collection

from ditto_fast.core.errors import UsageError
from ditto_fast.serve.answers import refusal
from ditto_fast.serve.hosts import AllowedHosts, origin_host

BODY_LIMIT = 64 << 10           # a job is a few hundred bytes, a WebRTC viewer's SDP offer a few KiB
DRAIN_LIMIT = 64 << 20          # a refused body is read (and dropped) up to this, so its client sees the answer
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")      # what changes nothing: any page may cause it (it reads no answer)
BODY_WINDOW_S = 30.0            # a body must bring BODY_MIN_RATE bytes a second over each window of this length:
BODY_MIN_RATE = 8 << 10         # a client that sends nothing, or a byte a second, holds no connection (nor an
#                                 upload's partial file) longer than a window
FORM_PROOF = b"x-requested-with"    # a header an upload must carry: a web form cannot send one, and another site's
#                                     script can only after a CORS preflight this server never answers
SAME_ORIGIN = ((b"cross-origin-resource-policy", b"same-origin"),   # on every answer: another site's page may not
               (b"x-content-type-options", b"nosniff"))             # embed a preview, an output or any JSON here
#                                                                     (an <img> or a <script> of a token-less server)


def bearer_matches(header: bytes, token: str) -> bool:
    """Whether an Authorization header carries `token` (the scheme Bearer in any case; compared in constant time)."""
    scheme, _, given = header.partition(b" ")
    return hmac.compare_digest(given, token.encode()) and scheme.lower() == b"bearer"


def foreign(headers: dict[bytes, bytes], hosts: AllowedHosts | None, changes: bool) -> tuple[str, int] | None:
    """Why a request from elsewhere is refused, with its status, or None: a Host that does not name this server
    (421; any Host without `hosts`); on a request that `changes` state, an Origin that is not this server's (the
    Host's own, or one `hosts` allows; 403), or no Origin from a browser that says the request is cross-site."""
    host = headers.get(b"host", b"").decode("latin-1")
    if hosts is not None and not hosts.allows(host):
        return (f"Host {host or '(none)'}: not a name this server answers to ({hosts.described()}); behind a "
                "reverse proxy or under another name, start serve with --allow-host NAME", 421)
    if not changes:
        return None
    origin = headers.get(b"origin")
    if origin is None:
        site = headers.get(b"sec-fetch-site", b"")
        if site in (b"cross-site", b"same-site"):
            return ("a request another site's page sent may change nothing here (Sec-Fetch-Site: "
                    f"{site.decode('latin-1')}); use the newsroom page this server serves", 403)
        return None
    text = origin.decode("latin-1")
    netloc = origin_host(text)
    if netloc is not None and (netloc.lower() == host.lower() or (hosts is not None and hosts.allows(netloc))):
        return None
    return (f"Origin {text}: a page of another site may change nothing here; use the newsroom page this server "
            "serves (a page served under another name: start serve with --allow-host NAME)", 403)


class BodyTooSlow(UsageError):
    """A request's body came slower than its pace allows (Paced)."""


class Paced:
    """A request's ASGI `receive` while its body comes: BodyTooSlow when fewer than BODY_MIN_RATE bytes a second
    arrive over a window of BODY_WINDOW_S seconds; once the body has ended, `receive` as it is (a response's wait for
    the client to go)."""

    def __init__(self, receive):
        self.receive, self.window, self.rate = receive, BODY_WINDOW_S, BODY_MIN_RATE
        self.ends, self.got, self.done = time.monotonic() + self.window, 0, False

    async def __call__(self) -> dict:
        while not self.done:
            try:
                message = await asyncio.wait_for(self.receive(), max(0.0, self.ends - time.monotonic()))
            except asyncio.TimeoutError:
                message = None
            if message is not None:
                self.got += len(message.get("body", b""))
                self.done = message["type"] != "http.request" or not message.get("more_body", False)
            now = time.monotonic()
            if now >= self.ends and not self.done:
                if self.got < self.rate * self.window:
                    raise BodyTooSlow(f"the request's body came too slowly ({self.got} bytes in the last "
                                      f"{self.window:g} s; at least {self.rate >> 10} KiB/s is needed) and was cut "
                                      "off; send it again over a faster link")
                self.ends, self.got = now + self.window, 0
            if message is not None:
                return message
        return await self.receive()


def too_slow(e: BodyTooSlow):
    """The answer to a body that came too slowly: 408, and the connection closed (the rest is not waited for)."""
    return refusal(str(e), 408, e.exit_code, headers={"Connection": "close"})


class RequestGate:
    """ASGI middleware before every route: a request (or WebSocket) from elsewhere is refused first (see `foreign`:
    its Host must be one of `hosts`, and its Origin this server's when it would change state; a WebSocket always
    counts as one that does); with a token, a request without it is 401 (but on `open_paths`); an upload (a POST to
    one of `streamed`) must carry FORM_PROOF (403 without): each before its body is read or parsed. Then the body is
    read whole, at most `limit` bytes (413 over it, with Content-Length or chunked), at its pace (Paced: 408 when it
    trickles). A refused request's body is read on to its end (up to DRAIN_LIMIT) and dropped, so that its client
    gets the answer rather than a reset connection. An upload is passed on as it comes, paced too: its route
    streams the body to a file under its own limit."""

    def __init__(self, app, token: str | None = None, limit: int = BODY_LIMIT, open_paths: Collection[str] = (),
                 streamed: Collection[str] = (), hosts: AllowedHosts | None = None):
        self.app, self.token, self.limit = app, token, limit
        self.open_paths, self.streamed, self.hosts = open_paths, streamed, hosts

    async def __call__(self, scope, receive, send):
        """Every answer, a refusal here or a route's, its headers with SAME_ORIGIN's."""
        return await self._gate(scope, receive, same_origin(send))

    async def _gate(self, scope, receive, send):
        if scope["type"] == "websocket":
            refused = foreign(dict(scope["headers"]), self.hosts, changes=True)
            if refused is not None:
                return await _refuse_websocket(scope, receive, send, *refused)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        receive = Paced(receive)
        headers = dict(scope["headers"])
        refused = foreign(headers, self.hosts, changes=scope["method"] not in SAFE_METHODS)
        if refused is not None:
            await drain(receive)
            return await refusal(*refused)(scope, receive, send)
        if self.token is not None and scope["path"] not in self.open_paths:
            if not bearer_matches(dict(scope["headers"]).get(b"authorization", b""), self.token):
                await drain(receive)
                return await refusal("missing or wrong bearer token", 401,
                                     headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        if scope["path"] in self.streamed and scope["method"] == "POST":
            if not headers.get(FORM_PROOF):
                await drain(receive)
                return await refusal("an upload must carry the header X-Requested-With (any value), which a web "
                                     "form cannot send; the newsroom page sends it", 403)(scope, receive, send)
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            try:
                message = await receive()
            except BodyTooSlow as e:
                return await too_slow(e)(scope, receive, send)
            if message["type"] != "http.request":       # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                if more:
                    await drain(receive, len(body))
                return await refusal(f"request body over {self.limit >> 10} KiB; {_body_is(scope)}",
                                     413)(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def same_origin(send):
    """ASGI `send` whose answers (HTTP, and a WebSocket's refusal as HTTP) carry SAME_ORIGIN's headers, unless they
    set them already."""
    async def sending(message: dict) -> None:
        if message["type"] in ("http.response.start", "websocket.http.response.start"):
            headers = list(message.get("headers", ()))
            have = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in SAME_ORIGIN if k not in have]
            message = {**message, "headers": headers}
        await send(message)
    return sending


def _body_is(scope) -> str:
    """What a request's body should be, said when it is over the limit: a WHEP viewer's SDP offer, else a job."""
    kind = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    if kind == b"application/sdp" or scope["path"].rstrip("/").endswith("/whep"):
        return "a WebRTC viewer's SDP offer is a few KiB of text (send the offer createOffer made, nothing else)"
    return "a job is one small JSON object"


async def _refuse_websocket(scope, receive, send, message: str, status: int) -> None:
    """Refuse a WebSocket before it is accepted: the API's JSON refusal as its HTTP answer where the server can send
    one, else closed with 1008 (the client sees HTTP 403)."""
    if (await receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        return await refusal(message, status)(scope, receive, send)
    await send({"type": "websocket.close", "code": 1008, "reason": message.encode()[:123].decode("utf-8", "ignore")})


async def drain(receive, seen: int = 0) -> None:
    """Read and drop the rest of a request's body (up to DRAIN_LIMIT bytes in all, `seen` of them read already;
    no more once it comes too slowly)."""
    while seen <= DRAIN_LIMIT:
        try:
            message = await receive()
        except BodyTooSlow:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))
