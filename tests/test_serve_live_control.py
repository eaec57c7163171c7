"""A live session's control under load, as an agent drives it through a real server: every clear answered, frames
still watched after hundreds of clears, a DELETE that ends the session (and says so) whatever speech is queued;
speech sent at its pace with no holes and each answer whole; one message cannot pass the cap on queued speech."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import soundfile as sf

from support import silent_holes, speech_clip
from test_serve_live import decoded_audio, wait_state, ws_url

websockets = pytest.importorskip("websockets")
pytestmark = pytest.mark.slow           # a real server and its engine process


async def _until(predicate, what, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.05)


def test_clears_never_drop_control_and_delete_ends_whatever_is_queued(serving, tmp_path):
    server = serving()
    out = tmp_path / "control.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    speech, _ = sf.read(speech_clip(tmp_path, "s.wav", 4.0, start=0.0), dtype="float32")
    pcm = np.round(speech * 32767).astype("<i2").tobytes()

    async def talk() -> tuple[list[dict], list[int], dict, float]:
        events: list[dict] = []
        media: list[int] = []
        async with websockets.connect(ws_url(server, sid), max_size=None) as ws:
            async def listen():
                async for x in ws:
                    if isinstance(x, bytes):
                        media.append(len(x))
                    else:
                        events.append(json.loads(x))
            reader = asyncio.ensure_future(listen())
            await ws.send(json.dumps({"rate": 16000, "media": True}))
            await ws.send(pcm)
            await ws.send(json.dumps({"end": True}))
            await _until(lambda: any(e.get("event") == "playback_started" for e in events), lambda: events)
            for _ in range(500):                # an agent interrupted again and again, speech between
                await ws.send(pcm[:640])
                await ws.send(json.dumps({"clear": True}))
            cleared = lambda: sum(e.get("event") == "cleared" for e in events)     # noqa: E731
            await _until(lambda: cleared() == 500, lambda: f"{cleared()} of 500 clears answered", 120)
            seen = len(media)
            await _until(lambda: len(media) >= seen + 25, lambda: f"{len(media) - seen} frames after the clears")
            await ws.send(pcm * 40)             # 160 s of speech waiting to be spoken
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            code, view = await asyncio.to_thread(server.call, "DELETE", f"/v1/live/{sid}")
            took = time.monotonic() - t0
            assert code == 200, view
            reader.cancel()
        return events, media, view, took

    events, media, view, took = asyncio.run(talk())
    assert view["state"] == "ended" and view["error"] is None, view      # within its 30 s wait, not left streaming
    stats = view["stats"]
    assert stats["ended_by"] == "DELETE", stats
    if stats["frames"]["on_time"] > 25:         # frames carried its speech out: their latency is said
        assert stats["latency_s"] is not None and view["first_frame_latency_s"] is not None, json.dumps(view)
    assert all(v is None or 0 <= v < 1000 for v in stats["rtf"].values()), stats["rtf"]
    finished = [e for e in events if e.get("event") == "playback_finished"]
    assert finished and finished[0]["segment"] == 1                         # the first answer, heard or cut
    assert server.call("GET", "/v1/live")[1]["live"][0]["state"] == "ended"
    assert took < 30


def _tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.round(0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")


def test_speech_at_its_pace_has_no_holes_and_each_answer_is_heard_whole(serving, tmp_path):
    server = serving()
    out = tmp_path / "paced.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    rate, seconds = 24000, 4.0
    tone = _tone(seconds, rate)

    async def talk() -> list[dict]:
        events: list[dict] = []
        async with websockets.connect(ws_url(server, sid)) as ws:
            async def listen():
                async for x in ws:
                    events.append(json.loads(x))
            reader = asyncio.ensure_future(listen())
            await ws.send(json.dumps({"rate": rate}))
            step = int(rate * 0.02)
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(tone), step)):     # 20 ms messages as they are spoken, no lead
                await ws.send(tone[i:i + step].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - time.monotonic()))
            await ws.send(json.dumps({"end": True}))
            await _until(lambda: any(e.get("event") == "playback_finished" for e in events), lambda: events)
            await asyncio.sleep(0.5)
            reader.cancel()
        return events

    events = asyncio.run(talk())
    (finished,) = [e for e in events if e.get("event") == "playback_finished"]
    assert finished["position_s"] == seconds and not finished["interrupted"], finished   # the resampler's tail too
    ended = server.call("DELETE", f"/v1/live/{sid}")[1]
    assert ended["state"] == "ended", ended
    late = ended["stats"]["speech_late"]        # pieces later than the cushion (0.1 s, then raised): a busy machine
    got = decoded_audio(out)
    span, holes = silent_holes(got, loud=0.05)
    assert len(holes) <= late <= 2, f"holes of silence in the speech: {holes} samples; {late} said late"
    assert len(span) / 16000 == pytest.approx(seconds + sum(holes) / 16000, abs=0.03)      # all of it, once


def test_one_message_cannot_pass_the_cap_on_waiting_speech(serving, tmp_path):
    server = serving()
    sid = server.call("POST", "/v1/live", {"avatar": "anchor"})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))

    async def send() -> tuple[dict, int]:
        async with websockets.connect(ws_url(server, sid)) as ws:
            await ws.send(json.dumps({"rate": 8000}))
            await ws.send(np.zeros(8000 * 601, "<i2").tobytes())        # ten minutes and a second, at once
            line = json.loads(await asyncio.wait_for(ws.recv(), 60))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)
            return line, ws.close_code

    line, code = asyncio.run(send())
    assert code == 1003 and "600 s of speech" in line["error"], line
    assert line["error"].count(sid) == 1, line
    assert server.call("GET", f"/v1/live/{sid}")[1]["speech_in_seconds"] == 0.0
