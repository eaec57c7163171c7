"""A live session's WebSocket, both ways (/v1/live/ID/audio): one audio client per session.

In: binary messages are the speech, s16le mono PCM (16 kHz, or the rate declared); text messages are JSON objects:
`{"rate": N}` (first, before any PCM; with `"media": true` the session's frames come back), `{"end": true}` (the
speech so far is one answer: its playback_finished comes once it has gone out), `{"clear": true}` (an interruption:
speech not yet spoken is dropped, what was taken goes out silent; the unfinished answers finish interrupted).
Out: playback events as JSON text (`{"event": "playback_started"|"playback_finished", "segment": N,
"position_s": S, "interrupted": B, "frame": F}`, and for each clear `{"event": "cleared", "frame": F}`: no frame
after F carries speech sent before the clear, so a client mutes what it still receives up to F); with media, one
binary message per frame: a 4-byte big-endian header length, the header (JSON: index, key, unit and pcm byte
counts, the frame rate and the PCM's rate), the frame as one H.264 access unit, then its slot's s16le speech (a
client more than MEDIA_QUEUED frames behind gets its frames' speech with no access unit until the next key frame). A
refusal is one JSON line `{"error", "exit_code"}` and a close: 1003 (not PCM, a bad message or rate), 4404 (no such
session), 4409 (it has an audio client already), 4410 (ended)."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from ditto_fast.audio.resample import BandResampler
from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import shown
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE, STREAM_SAMPLE_RATE

CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_UNKNOWN, CLOSE_TAKEN, CLOSE_ENDED = 1003, 1008, 4404, 4409, 4410
PCM_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
ENDED_POLL_S = 0.5
MEDIA_QUEUED = 50               # frames a slow client may fall behind before it skips to the next key frame
MESSAGES = {"rate": "first, before any PCM: {\"rate\": N} (\"media\": true for the frames back)",
            "end": "{\"end\": true}: an answer's end", "clear": "{\"clear\": true}: an interruption"}


def read_message(text: str, first: bool) -> dict[str, Any]:
    """A client's text message as one of MESSAGES (`first`: no PCM came yet); UsageError naming what is taken."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    keys = set(value) if isinstance(value, dict) else set()
    if keys and keys <= {"rate", "media"} and first:
        rate, media = value.get("rate", SPEECH_SAMPLE_RATE), value.get("media", False)
        if isinstance(rate, int) and not isinstance(rate, bool) and rate in PCM_RATES and isinstance(media, bool):
            return {"rate": rate, "media": media}
        raise UsageError(f"{{\"rate\": N}} takes N one of {', '.join(map(str, PCM_RATES))} (and \"media\" true or "
                         f"false); got {shown(text[:80])}")
    if keys in ({"end"}, {"clear"}) and value[next(iter(keys))] is True:
        return value
    taken = "; ".join(MESSAGES.values())
    why = "the rate is declared once, before any audio" if keys and keys <= {"rate", "media"} else \
        f"got {shown(text[:80])}"
    raise UsageError(f"a text message where PCM is expected ({why}): send the speech as binary messages (s16le "
                     f"mono); the text messages are {taken}")


def media_message(media: tuple, rate: Any) -> bytes:
    """One frame of the session for the client: header length, header, access unit, its slot's PCM."""
    index, unit, key, pcm = media
    header = json.dumps({"index": index, "key": key, "unit": len(unit), "pcm": len(pcm), "rate": str(rate),
                         "pcm_rate": STREAM_SAMPLE_RATE}).encode()
    return struct.pack(">I", len(header)) + header + unit + pcm


async def serve_socket(ws: WebSocket, session: Any) -> None:
    """The session's audio client, from its accepted socket to its end."""
    if not session.active:
        return await refuse(ws, CLOSE_ENDED, f"live session {session.id} has {session.state}; open a new one with "
                                             "POST /v1/live")
    if not session.connect():
        return await refuse(ws, CLOSE_TAKEN, f"live session {session.id} has an audio client already; one client "
                                             "speaks for a session (close the other first)")
    loop = asyncio.get_running_loop()
    outbox: asyncio.Queue = asyncio.Queue()
    state = {"keyed": False}

    def out(item: Any) -> None:
        loop.call_soon_threadsafe(_post, outbox, item, state)
    unlisten = session.listen(out)
    sender = asyncio.create_task(_send(ws, outbox, session))
    leave_media = None
    resample: BandResampler | None = None       # to what the model hears (16 kHz) and the stream's 48 kHz (its band)
    try:
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), ENDED_POLL_S)
            except asyncio.TimeoutError:
                if not session.active:
                    return await refuse(ws, CLOSE_ENDED, f"live session {session.id} has {session.state}")
                continue
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                said = read_message(message["text"], resample is None)
                if "rate" in said:
                    resample = BandResampler(said["rate"])
                    if said["media"]:
                        leave_media = session.link.watch(lambda media: out(("media", media)))
                elif "end" in said:        # the answer whole: what its resamplers still hold goes with it
                    if resample is not None:
                        session.feed(*resample.flush())
                    session.link.end_segment()
                else:                       # what they hold was never spoken: dropped with the rest
                    if resample is not None:
                        resample.flush()
                    session.link.clear()
                continue
            if resample is None:
                resample = BandResampler(SPEECH_SAMPLE_RATE)
            pcm = message.get("bytes") or b""
            session.feed(*resample(pcm))
            if not session.active:
                return await refuse(ws, CLOSE_ENDED, f"live session {session.id} has {session.state}")
    except UsageError as e:
        await refuse(ws, CLOSE_BAD_DATA, f"live session {session.id}: {e}")
    except WebSocketDisconnect:
        pass
    finally:
        unlisten()
        if leave_media is not None:
            leave_media()
        sender.cancel()
        session.disconnected()


def _post(outbox: asyncio.Queue, item: Any, state: dict) -> None:
    """Queue an event, or a frame (a client that fell behind gets the frames up to the next key frame as their speech
    alone, an empty access unit: the picture skips, every sample of the speech still comes)."""
    if isinstance(item, tuple) and item[0] == "media":
        media = item[1]
        if media is None:
            return
        if outbox.qsize() > MEDIA_QUEUED:
            state["keyed"] = False
        state["keyed"] = state["keyed"] or media[2]
        if not state["keyed"]:
            item = ("media", (media[0], b"", False, media[3]))
    outbox.put_nowait(item)


async def _send(ws: WebSocket, outbox: asyncio.Queue, session: Any) -> None:
    while True:
        item = await outbox.get()
        try:
            if isinstance(item, tuple):
                await ws.send_bytes(media_message(item[1], session.rate))
            else:
                await ws.send_text(json.dumps(item))
        except (RuntimeError, WebSocketDisconnect, OSError):
            return


async def refuse(ws: WebSocket, code: int, line: str) -> None:
    """Say why in one JSON message, then close with `code` (the reason cut to the 123 bytes a close frame holds)."""
    try:
        await ws.send_json({"error": line, "exit_code": UsageError.exit_code})
        await ws.close(code=code, reason=line.encode()[:123].decode("utf-8", "ignore"))
    except (RuntimeError, WebSocketDisconnect, OSError):     # the client is gone already
        pass
