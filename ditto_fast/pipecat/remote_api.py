"""A running `ditto-fast serve`'s live API as the remote Pipecat service calls it (no Pipecat here): open a session
(POST /v1/live), end one (DELETE); an answer that is not a serve's is told apart from a serve's refusal."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any


class NotAServe(Exception):
    """What answered at the URL is not a ditto-fast serve (not its JSON, or not its live API)."""


class Refused(Exception):
    """The serve refused the session: its line, and the HTTP status it answered with."""

    def __init__(self, line: str, status: int) -> None:
        super().__init__(line)
        self.status = status


def call(url: str, token: str | None, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, Any]:
    """(HTTP status, the JSON it answered) of `method path` at `url`; OSError where nothing answers, NotAServe where
    the answer is not JSON."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, kind, raw = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        status, kind, raw = e.code, e.headers.get("Content-Type", ""), e.read()
    except http.client.HTTPException as e:
        if isinstance(e, OSError):      # a connection dropped before the answer: nothing answers
            raise
        raise NotAServe(f"{method} {path} got no HTTP answer: {type(e).__name__}") from None
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        raise NotAServe(f"{method} {path} answered HTTP {status}, {kind.split(';')[0] or 'no Content-Type'}, "
                        "not JSON") from None


def open_session(url: str, token: str | None, body: dict, timeout: float) -> dict:
    """The new session's view ({"id", "audio", ...}); OSError (nothing answers), NotAServe, or Refused."""
    status, view = call(url, token, "POST", "/v1/live", body, timeout)
    if isinstance(view, dict) and isinstance(view.get("id"), str) and isinstance(view.get("audio"), str):
        return view
    if isinstance(view, dict) and isinstance(view.get("error"), str) and "exit_code" in view:
        raise Refused(view["error"], status)
    raise NotAServe(f"POST /v1/live answered HTTP {status} with JSON that is no live session's nor a refusal's")


def end_session(url: str, token: str | None, sid: str, timeout: float) -> None:
    """End session `sid` if it still runs (quietly: a server that is gone has ended it)."""
    try:
        call(url, token, "DELETE", f"/v1/live/{sid}", None, timeout)
    except (OSError, NotAServe):
        pass
