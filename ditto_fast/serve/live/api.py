"""The live routes of the job API: POST /v1/live opens a session, GET /v1/live[/ID] tells its state and figures,
DELETE ends it cleanly; POST /v1/live/ID/whep takes a WebRTC viewer's SDP offer (WHEP: 201, the SDP answer and its
Location, which DELETE ends); the WebSocket /v1/live/ID/audio takes its speech as binary s16le mono PCM (16 kHz, or
the rate a first text message {"rate": N} declares). A refused WebSocket message gets one JSON line
{"error", "exit_code"} and the socket is closed (1003: not PCM or a bad rate, 4404: no such session, 4410: ended)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Body, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response

from ditto_fast.audio.resample import Resampler
from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE
from ditto_fast.serve.live.sessions import LiveSessions, pcm_rate

CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_UNKNOWN, CLOSE_ENDED = 1003, 1008, 4404, 4410
ENDED_POLL_S = 0.5
START_WAIT_S = 60.0             # how long a viewer's offer waits for its session to start streaming


def add_live_routes(app: FastAPI, sessions: LiveSessions, token: str | None, answer, refusal, error) -> None:
    """The live routes on `app` (`answer`, `refusal`, `error`: the API's JSON answer and refusals)."""
    from ditto_fast.serve.auth import bearer_matches

    @app.post("/v1/live", status_code=201)
    def open_session(body: Any = Body(None)):
        try:
            session = sessions.open(body)
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
        if token is not None and not bearer_matches(ws.headers.get("authorization", "").encode(), token):
            await ws.close(code=CLOSE_POLICY, reason="missing or wrong bearer token")    # before accept: HTTP 403
            return
        await ws.accept()
        session = sessions.get(sid)
        if session is None:
            return await _refuse(ws, CLOSE_UNKNOWN, f"no live session {sid}; open one with POST /v1/live")
        if not session.active:
            return await _refuse(ws, CLOSE_ENDED, f"live session {sid} has {session.state}; open a new one with "
                                                  "POST /v1/live")
        session.connected()
        resample: Resampler | None = None
        try:
            while True:
                try:
                    message = await asyncio.wait_for(ws.receive(), ENDED_POLL_S)
                except asyncio.TimeoutError:
                    if not session.active:
                        return await _refuse(ws, CLOSE_ENDED, f"live session {sid} has {session.state}")
                    continue
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    if resample is not None:
                        raise UsageError(f"live session {sid}: a text message where PCM is expected; send the speech "
                                         "as binary messages (s16le mono), a {\"rate\": N} only before the first")
                    resample = Resampler(pcm_rate(message["text"]))
                    continue
                if resample is None:
                    resample = Resampler(SPEECH_SAMPLE_RATE)
                session.feed(resample(message.get("bytes") or b""))
                if not session.active:
                    return await _refuse(ws, CLOSE_ENDED, f"live session {sid} has {session.state}")
        except UsageError as e:
            await _refuse(ws, CLOSE_BAD_DATA, str(e))
        except WebSocketDisconnect:
            pass
        finally:
            session.disconnected()


async def _refuse(ws: WebSocket, code: int, line: str) -> None:
    """Say why in one JSON message, then close with `code` (the reason cut to the 123 bytes a close frame holds)."""
    try:
        await ws.send_json({"error": line, "exit_code": UsageError.exit_code})
        await ws.close(code=code, reason=line.encode()[:123].decode("utf-8", "ignore"))
    except (RuntimeError, WebSocketDisconnect, OSError):     # the client is gone already
        pass
