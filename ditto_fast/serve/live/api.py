"""The live routes of the job API: POST /v1/live opens a session, GET /v1/live[/ID] tells its state and figures,
DELETE ends it cleanly; POST /v1/live/ID/whep takes a WebRTC viewer's SDP offer (WHEP: 201, the SDP answer and its
Location, which DELETE ends; 503 with Retry-After while the session has its most viewers); the WebSocket /v1/live/ID/audio is its audio client, both ways (socket.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Body, FastAPI, Request, WebSocket
from fastapi.responses import Response

from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.serve.live.sessions import LiveSessions
from ditto_fast.serve.live.socket import CLOSE_POLICY, CLOSE_UNKNOWN, ENDED_POLL_S, refuse, serve_socket
from ditto_fast.serve.live.whep import ViewersFull
START_WAIT_S = 60.0             # how long a viewer's offer waits for its session to start streaming


def add_live_routes(app: FastAPI, sessions: LiveSessions, token: str | None, answer, refusal, error) -> None:
    """The live routes on `app` (`answer`, `refusal`, `error`: the API's JSON answer and refusals)."""
    from ditto_fast.serve.auth import bearer_matches

    @app.post("/v1/live", status_code=201)
    async def open_session(request: Request, body: Any = Body(None)):
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return refusal(f"POST /v1/live: send the session as a JSON object with Content-Type: application/json "
                           f"(got {kind or 'no Content-Type'})", 415)
        try:
            session = await asyncio.to_thread(sessions.open, body)
        except DittoError as e:
            return error(e, 409 if "--max-live" in str(e) else 400)
        return session.view()

    @app.get("/v1/live")
    def list_sessions():
        return {"live": [s.view() for s in sessions.list()]}

    @app.get("/v1/live/{sid}")
    def look_up(sid: str):
        session = sessions.get(sid)
        return session.view() if session else refusal(f"no live session {sid}", 404)

    @app.delete("/v1/live/{sid}")
    def end(sid: str):
        session = sessions.get(sid)
        if session is None:
            return refusal(f"no live session {sid}", 404)
        if not session.active:
            return answer({"error": f"live session {sid} has {session.state} already; there is nothing to end",
                           "exit_code": UsageError.exit_code, "live": session.view()}, status_code=409)
        session.end()
        return session.view()

    @app.post("/v1/live/{sid}/whep", status_code=201, response_class=Response,
              responses={201: {"content": {"application/sdp": {}}, "description": "The SDP answer; Location names "
                               "the viewer (DELETE it to stop watching)."}})
    async def watch(sid: str, request: Request):
        """A WebRTC viewer (WHEP): the body is its SDP offer (Content-Type: application/sdp)."""
        session = sessions.get(sid)
        if session is None:
            return refusal(f"no live session {sid}", 404)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/sdp":
            return refusal(f"POST /v1/live/{sid}/whep: send the SDP offer as Content-Type: application/sdp "
                           f"(WHEP), got {kind or 'none'}", 415)
        for _ in range(int(START_WAIT_S / ENDED_POLL_S)):
            if session.state != "starting":
                break
            await asyncio.sleep(ENDED_POLL_S)
        try:
            vid, sdp = await sessions.viewers.offer(session, (await request.body()).decode("utf-8", "replace"))
        except ViewersFull as e:
            return refusal(str(e), 503, e.exit_code, headers={"Retry-After": str(e.retry_after)})
        except DittoError as e:
            return error(e, 409 if not session.active else 400)
        return Response(sdp, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/live/{sid}/whep/{vid}"})

    @app.delete("/v1/live/{sid}/whep/{vid}")
    async def unwatch(sid: str, vid: str):
        if not await sessions.viewers.end(sid, vid):
            return refusal(f"no viewer {vid} of live session {sid}", 404)
        return {"id": sid, "viewer": vid, "state": "ended"}

    @app.websocket("/v1/live/{sid}/audio")
    async def audio(ws: WebSocket, sid: str):
        """The session's audio client, both ways (serve/live/socket.py)."""
        if token is not None and not bearer_matches(ws.headers.get("authorization", "").encode(), token):
            await ws.close(code=CLOSE_POLICY, reason="missing or wrong bearer token")    # before accept: HTTP 403
            return
        await ws.accept()
        session = sessions.get(sid)
        if session is None:
            return await refuse(ws, CLOSE_UNKNOWN, f"no live session {sid}; open one with POST /v1/live")
        await serve_socket(ws, session)
