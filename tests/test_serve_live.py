"""`serve`'s live sessions as a voice agent uses them: a real server, a real WebSocket client (the `websockets`
library) sending a TTS's PCM in real time, the session's .ts decoded by ffmpeg and its audio compared with what was
sent; an idle client, the render queue held while a session streams, and every refusal."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from support import processes_naming, speech_clip, until_gone

websockets = pytest.importorskip("websockets")

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
CHUNK_S = 0.02
LEAD_S = 0.5        # the client's lead on the speech it sends


def ws_url(server, sid: str) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/live/{sid}/audio"


async def send_pcm(url: str, pcm: np.ndarray, rate: int, declare: bool = True, after: float = 0.0,
                   lead: float = LEAD_S) -> None:
    """Connect, declare the rate, send int16 `pcm` in 20 ms messages at the pace it is spoken, `lead` s ahead of it
    (as a TTS is: the stream's 0.1 s jitter allowance alone is less than a busy test machine's hiccups), wait."""
    async with websockets.connect(url) as ws:
        if declare:
            await ws.send(json.dumps({"rate": rate}))
        step = int(rate * CHUNK_S)
        t0 = time.monotonic()
        for k, i in enumerate(range(0, len(pcm), step)):
            await ws.send(pcm[i:i + step].tobytes())
            await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_S - lead - time.monotonic()))
        await asyncio.sleep(after)


async def refused(url: str, *messages) -> tuple[dict, int]:
    """Send `messages`; the JSON line the server answers and the close code it closes with."""
    async with websockets.connect(url) as ws:
        for m in messages:
            await ws.send(m)
        line = json.loads(await asyncio.wait_for(ws.recv(), 30))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)
        return line, ws.close_code


def wait_state(server, sid: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    return server.wait(sid, states, timeout, kind="live")


def decoded_audio(path: Path) -> np.ndarray:
    """The stream's audio as ffmpeg decodes it: 16 kHz mono float32."""
    raw = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(path), "-vn", "-ac", "1",
                          "-ar", "16000", "-f", "f32le", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.float32)


def wait_streamed(server, sid: str, out: Path, timeout: float = 120) -> None:
    """Until the session has sent a second of frames and its file holds video that decodes (a loaded host may take
    longer than an idle one's two seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        frames = (server.call("GET", f"/v1/live/{sid}")[1].get("frames") or {}).get("sent", 0)
        if frames >= 25 and out.exists():
            try:
                if video_frames(out)[1] > 0:
                    return
            except (StopIteration, IndexError):
                pass
        assert time.monotonic() < deadline, f"{frames} frames sent, no video in {out} after {timeout:g} s"
        time.sleep(0.3)


def video_frames(path: Path) -> tuple[str, int]:
    """The video stream's size and its frame count, as ffmpeg decodes it."""
    res = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-i", str(path), "-map", "0:v", "-f", "null", "-"],
                         capture_output=True, text=True)
    size = next(m.group(0) for ln in res.stderr.splitlines() if "Video:" in ln
                for m in [re.search(r"\b\d{2,5}x\d{2,5}\b", ln)] if m)
    frames = [ln.split("frame=")[1].split()[0] for ln in res.stderr.replace("\r", "\n").splitlines() if "frame=" in ln]
    return size, int(frames[-1])


def test_a_client_that_falls_behind_skips_pictures_never_speech():
    """Frames for a WebSocket client more than MEDIA_QUEUED behind: each still goes, with its speech; the picture
    is left out from then to the next key frame (where a decoder joins again)."""
    from ditto_fast.serve.live.socket import MEDIA_QUEUED, _post

    outbox, state, pcm = asyncio.Queue(), {"keyed": False}, np.arange(1920, dtype="<i2").tobytes()
    sent = 3 * MEDIA_QUEUED + 7
    keys = set(range(0, sent, MEDIA_QUEUED))                      # a key frame every MEDIA_QUEUED (a GOP)
    for i in range(sent):                                          # nobody takes them
        _post(outbox, ("media", (i, b"unit %d" % i, i in keys, pcm)), state)
    _post(outbox, {"event": "playback_finished", "segment": 1, "frame": sent - 1}, state)
    queued = [outbox.get_nowait() for _ in range(outbox.qsize())]
    media = [m for kind, m in queued[:-1]]
    assert [m[0] for m in media] == list(range(sent)) and all(m[3] == pcm for m in media)   # all the speech
    assert queued[-1]["event"] == "playback_finished"
    skipped = [m[0] for m in media if m[1] == b""]
    assert skipped and not keys & set(skipped)                     # pictures left out; never a key frame's
    assert all(m[1] == b"unit %d" % m[0] for m in media if m[1])
    assert all(m[2] is False for m in media if not m[1])


@pytest.mark.slow
def test_websocket_pcm_at_24k_goes_out_in_the_ts(serving, tmp_path):
    server = serving()
    speech16, _ = sf.read(speech_clip(tmp_path, "speech.wav", 3.0), dtype="float32")
    import soxr

    pcm24 = np.round(soxr.resample(speech16, 16000, 24000) * 32767).astype("<i2")
    out = tmp_path / "live.ts"
    code, view = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out), "max_latency": 3.0})
    assert code == 201, view
    sid = view["id"]
    assert view["audio"] == f"/v1/live/{sid}/audio" and view["state"] == "starting"
    wait_state(server, sid, ("idle", "streaming"))
    listed = server.call("GET", "/v1/jobs")[1]
    assert [s["id"] for s in listed["live"]] == [sid]
    asyncio.run(send_pcm(ws_url(server, sid), pcm24, 24000, after=4.0))
    during = server.call("GET", f"/v1/live/{sid}")[1]
    assert during["speech_in_seconds"] == pytest.approx(3.0, abs=0.05)
    code, ended = server.call("DELETE", f"/v1/live/{sid}")
    assert code == 200 and ended["state"] == "ended", ended
    assert ended["frames"]["sent"] > 0
    if ended["frames"]["skipped"] == 0:     # every frame rendered (a host not too busy): the speech's was shown
        assert ended["first_frame_latency_s"] is not None, ended
    assert server.call("DELETE", f"/v1/live/{sid}")[0] == 409

    size, frames = video_frames(out)
    assert size == "1920x1080"
    got = decoded_audio(out)
    assert frames == pytest.approx(len(got) / 16000 * 25, abs=3)        # picture and audio as long
    # the speech sent is in the stream, once, in order: its best alignment matches it closely
    corr = np.correlate(got, speech16, mode="valid")
    at = int(np.argmax(corr))
    part = got[at:at + len(speech16)]
    assert np.corrcoef(part, speech16)[0, 1] > 0.9
    assert np.abs(np.delete(got, np.s_[at:at + len(speech16)])).max() < 0.02      # silence around it
    metrics = server.call_text("/metrics")
    assert 'ditto_fast_live_sessions{state="ended"} 1.0' in metrics
    assert 'ditto_fast_live_frames{kind="sent"}' in metrics


@pytest.mark.slow
def test_client_gone_idles_then_ends_and_renders_wait_for_it(serving, tmp_path):
    server = serving("--live-idle-timeout", "3")
    out = tmp_path / "idle.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    job = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(speech_clip(tmp_path, "a.wav", 0.5)),
                                           "output": str(tmp_path / "clip.mp4")})[1]["id"]
    speech16, _ = sf.read(speech_clip(tmp_path, "s.wav", 1.0), dtype="float32")
    asyncio.run(send_pcm(ws_url(server, sid), np.round(speech16 * 32767).astype("<i2"), 16000, declare=False))
    assert server.call("GET", f"/v1/live/{sid}")[1]["state"] in ("idle", "streaming")
    assert server.call("GET", f"/v1/jobs/{job}")[1]["status"] == "queued"      # held while the session streams
    view = wait_state(server, sid, ("ended", "failed"), timeout=60)
    assert view["state"] == "ended", view
    assert server.wait(job)["status"] == "done"
    assert video_frames(out)[1] > 25
    assert "--live-idle-timeout" in server.log.read_text()


@pytest.mark.slow
def test_refusals(serving, tmp_path):
    server = serving("--max-live", "1")
    refuse = [({"avatar": "nobody", "out": str(tmp_path / "a.ts")}, "nobody"),
              ({"avatar": "anchor", "out": "srt://127.0.0.1:9000"}, "--live-outputs any"),
              ({"avatar": "anchor", "out": "/etc/x.ts"}, "outside the folders"),
              ({"avatar": "anchor", "out": str(tmp_path / "a.mp4")}, "not a stream destination"),
              ({"avatar": "anchor", "out": str(tmp_path / "a.ts"), "audio": "x.wav"}, "unknown field"),
              ({"avatar": "anchor", "out": str(tmp_path / "a.ts"), "emotion": "{\"0\": \"happy\"}"}, "schedule"),
              ({"avatar": "anchor", "out": ""}, "out, when given")]
    for body, words in refuse:
        code, answer = server.call("POST", "/v1/live", body)
        assert 400 <= code < 500 and words in answer["error"] and "\n" not in answer["error"], (body, answer)
    line, close = asyncio.run(refused(ws_url(server, "nope")))
    assert close == 4404 and "no live session nope" in line["error"]

    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "b.ts")})[1]["id"]
    code, busy = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "c.ts")})
    assert code == 409 and "--max-live" in busy["error"]
    line, close = asyncio.run(refused(ws_url(server, sid), json.dumps({"rate": 7000})))
    assert close == 1003 and "rate" in line["error"] and "24000" in line["error"]
    line, close = asyncio.run(refused(ws_url(server, sid), b"\0\0" * 320, "hello"))
    assert close == 1003 and "where PCM is expected" in line["error"]
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    line, close = asyncio.run(refused(ws_url(server, sid)))
    assert close == 4410 and "ended" in line["error"]
    assert server.call("GET", "/v1/live/nope")[0] == 404


def test_token_rules_hold_for_live(serve_parts, tmp_path):
    """In process: POST /v1/live and the audio WebSocket need the token as the jobs do; a WebSocket without it is
    refused at the handshake (HTTP 403), with it an unknown session is a 4404 and its line."""
    from conftest import SERVE_TOKEN
    from fastapi.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.live.sessions import LiveSessions

    p = serve_parts
    live = LiveSessions(p.dispatcher.handles, p.acceptor.setup, [tmp_path], p.acceptor.avatars, p.events.append)
    client = TestClient(make_app(p.queue, p.acceptor, p.dispatcher, p.metrics, token=SERVE_TOKEN, live=live))
    assert client.post("/v1/live", json={"avatar": "anchor", "out": str(tmp_path / "x.ts")}).status_code == 401
    with pytest.raises(WebSocketDisconnect) as refused_ws:
        with client.websocket_connect("/v1/live/nope/audio"):
            pass
    assert refused_ws.value.code == 1008
    with client.websocket_connect("/v1/live/nope/audio", headers={"Authorization": f"Bearer {SERVE_TOKEN}"}) as ws:
        assert "no live session nope" in ws.receive_json()["error"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 4404
    listed = client.get("/v1/jobs", headers={"Authorization": f"Bearer {SERVE_TOKEN}"}).json()
    assert listed["live"] == []


def _log_lines(server) -> list[dict]:
    return [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_session_lives_on_while_the_page_polls_and_health_names_its_engine(serving, tmp_path):
    """The page polls two routes at once, so the HTTP server's worker threads come and go: the session opened from
    one of them streams on (it died 10-15 s in when its process was started from that thread)."""
    import threading

    server = serving()
    code, view = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "polled.ts")})
    assert code == 201, view
    sid = view["id"]
    wait_state(server, sid, ("idle", "streaming"))
    health = server.call("GET", "/healthz")[1]
    (engine,) = health["engines"]
    carried = health["live"]["sessions"]
    assert carried == [{"id": sid, "state": "idle", "engine": "engine-0", "pid": int(engine["where"].split()[1])}]
    assert engine["sessions"] == [sid]
    stop = threading.Event()

    def poll(path: str) -> None:
        while not stop.is_set():
            server.call("GET", path)
            time.sleep(0.7)
    pollers = [threading.Thread(target=poll, args=(p,)) for p in ("/v1/jobs", "/v1/live")]
    for t in pollers:
        t.start()
    time.sleep(20)
    stop.set()
    for t in pollers:
        t.join()
    view = server.call("GET", f"/v1/live/{sid}")[1]
    assert view["state"] == "idle" and view["error"] is None, view
    assert server.call("GET", "/healthz")[1]["engines"][0]["restarts"] == 0
    code, ended = server.call("DELETE", f"/v1/live/{sid}")
    assert code == 200 and ended["state"] == "ended" and ended["frames"]["sent"] >= 25 * 15, ended
    assert video_frames(tmp_path / "polled.ts")[1] == ended["frames"]["sent"]


@pytest.mark.slow
def test_a_hung_engine_under_a_session_is_found_and_the_server_goes_on(serving, tmp_path):
    import os
    import signal

    server = serving("--heartbeat-timeout", "3")
    out = tmp_path / "hung.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    pid = int(engine["where"].split()[1])
    wait_streamed(server, sid, out)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    view = wait_state(server, sid, ("ended", "failed"), timeout=30)
    assert time.monotonic() - t0 < 3 + 6
    assert view["state"] == "failed" and "hung" in view["error"] and "heartbeat" in view["error"], view
    assert video_frames(out)[1] > 0                     # what it streamed stays playable
    deadline = time.monotonic() + 120
    while server.call("GET", "/healthz")[0] != 200:     # a fresh engine
        assert time.monotonic() - deadline < 0, server.log.read_text()[-2000:]
        time.sleep(0.3)
    nxt = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "next.ts")})[1]["id"]
    wait_state(server, nxt, ("idle", "streaming"))
    assert server.call("DELETE", f"/v1/live/{nxt}")[1]["state"] == "ended"
    job = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(speech_clip(tmp_path, "a.wav", 0.5)),
                                           "output": str(tmp_path / "after.mp4")})[1]["id"]
    assert server.wait(job)["status"] == "done"
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert engine["restarts"] == 1 and "hung" in engine["last_death"], engine
    assert server.stop() == 0


@pytest.mark.slow
def test_sigterm_ends_every_session_cleanly(serving, tmp_path):
    server = serving("--max-live", "2")
    sids = [server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / f"{k}.ts")})[1]["id"]
            for k in range(2)]
    for k, sid in enumerate(sids):
        wait_state(server, sid, ("idle", "streaming"))
        wait_streamed(server, sid, tmp_path / f"{k}.ts")
    assert server.stop() == 0
    ended = {e["live"]: e for e in _log_lines(server) if e.get("live") and e.get("state") in ("ended", "failed")}
    assert sorted(ended) == sorted(sids) and all(e["state"] == "ended" for e in ended.values()), ended
    for k, sid in enumerate(sids):
        assert video_frames(tmp_path / f"{k}.ts")[1] == ended[sid]["stats"]["frames"]["sent"]


def _frames_of(messages: list[bytes]) -> list[tuple[dict, bytes, bytes]]:
    """The media messages a client got back: (header, access unit, pcm) each."""
    import struct

    out = []
    for m in messages:
        n = struct.unpack(">I", m[:4])[0]
        header = json.loads(m[4:4 + n])
        unit = m[4 + n:4 + n + header["unit"]]
        out.append((header, unit, m[4 + n + header["unit"]:]))
    return out


@pytest.mark.slow
def test_the_websocket_both_ways_answers_interruptions_and_frames(serving, tmp_path):
    import av

    server = serving()
    out = tmp_path / "both.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    first, _ = sf.read(speech_clip(tmp_path, "one.wav", 2.0, start=0.0), dtype="float32")
    second, _ = sf.read(speech_clip(tmp_path, "two.wav", 4.0, start=0.0), dtype="float32")

    async def talk() -> tuple[list[dict], list[bytes], tuple[dict, int]]:
        events, media = [], []
        async with websockets.connect(ws_url(server, sid)) as ws:
            async def listen():
                async for m in ws:
                    (media if isinstance(m, bytes) else events).append(m if isinstance(m, bytes) else json.loads(m))
            reader = asyncio.ensure_future(listen())
            await ws.send(json.dumps({"rate": 16000, "media": True}))
            other = await refused(ws_url(server, sid))           # one audio client a session
            await ws.send(np.round(first * 32767).astype("<i2").tobytes())
            await ws.send(json.dumps({"end": True}))
            deadline = time.monotonic() + 30
            while not any(e.get("event") == "playback_finished" for e in events):
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.1)
            await ws.send(np.round(second * 32767).astype("<i2").tobytes())     # a whole answer at once
            await ws.send(json.dumps({"end": True}))
            while not [e for e in events if e.get("event") == "playback_started" and e["segment"] == 2]:
                assert time.monotonic() < deadline + 30, events
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            await ws.send(json.dumps({"clear": True}))                        # the caller interrupts
            while len([e for e in events if e.get("event") == "playback_finished"]) < 2:
                assert time.monotonic() < deadline + 60, events
                await asyncio.sleep(0.1)
            await asyncio.sleep(4.0)
            reader.cancel()
        return events, media, other

    events, media, (line, code) = asyncio.run(talk())
    assert code == 4409 and "audio client already" in line["error"]
    finished = [e for e in events if e.get("event") == "playback_finished"]
    assert {k: v for k, v in finished[0].items() if k != "frame"} == \
        {"event": "playback_finished", "segment": 1, "position_s": 2.0, "interrupted": False}
    assert finished[1]["frame"] > finished[0]["frame"] > 0              # the frames that carried their ends out
    assert finished[1]["segment"] == 2 and finished[1]["interrupted"] and 0.5 < finished[1]["position_s"] < 3.0
    frames = _frames_of(media)
    (cleared,) = [e for e in events if e.get("event") == "cleared"]          # each clear answered, with its frame
    assert cleared["frame"] >= finished[1]["frame"]
    after = [np.frombuffer(pcm, "<i2") for h, _, pcm in frames if h["index"] > cleared["frame"]]
    assert len(after) >= 50 and not any(np.abs(p).max() for p in after)       # no speech after it: a client mutes to F
    assert any(np.abs(np.frombuffer(pcm, "<i2")).max() > 1000 for h, _, pcm in frames if h["index"] <= cleared["frame"])
    assert frames[0][0]["key"] and frames[0][0]["rate"] == "25" and frames[0][0]["pcm_rate"] == 48000
    decoder = av.CodecContext.create("h264", "r")
    pictures = [p for _, unit, _ in frames[:30] for p in decoder.decode(av.Packet(unit))]
    assert len(pictures) >= 25 and (pictures[0].width, pictures[0].height) == (1920, 1080)
    assert [h["index"] for h, _, _ in frames] == list(range(frames[0][0]["index"], frames[0][0]["index"] + len(frames)))
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    # what went out: the first answer whole, the second only up to the interruption (then silence)
    got = decoded_audio(out)
    loud = np.convolve(np.abs(got) > 0.02, np.ones(1600) / 1600, mode="same") > 0.05
    spoken = loud.sum() / 16000
    assert 1.5 < spoken < 2.0 + finished[1]["position_s"] + 1.0, (spoken, finished)     # not the 6 s sent


@pytest.mark.slow
def test_an_answer_sent_whole_is_spoken_before_the_session_counts_as_idle(serving, tmp_path):
    server = serving("--live-idle-timeout", "1")
    out = tmp_path / "whole.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    speech, _ = sf.read(speech_clip(tmp_path, "whole.wav", 5.0, start=0.0), dtype="float32")

    async def burst() -> None:
        async with websockets.connect(ws_url(server, sid)) as ws:
            await ws.send(np.round(speech * 32767).astype("<i2").tobytes())
    asyncio.run(burst())
    view = wait_state(server, sid, ("ended", "failed"), timeout=60)
    assert view["state"] == "ended", view
    got = decoded_audio(out)
    corr = np.correlate(got, speech, mode="valid")
    at = int(np.argmax(corr))
    assert np.corrcoef(got[at:at + len(speech)], speech)[0, 1] > 0.9       # all of it, then the end


@pytest.mark.slow
def test_the_stream_keeps_the_speech_band_and_level(serving, tmp_path):
    """A 24 kHz client's 10 kHz tone (above what the model's 16 kHz carries) goes out at its own level on both
    channels."""
    server = serving()
    out = tmp_path / "band.ts"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(out)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    t = np.arange(24000 * 3) / 24000
    tone = 0.5 * np.sin(2 * np.pi * 10000 * t)                  # -6 dBFS peak, 10 kHz
    asyncio.run(send_pcm(ws_url(server, sid), np.round(tone * 32767).astype("<i2"), 24000, after=4.0))
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    raw = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(out), "-vn",
                          "-ar", "48000", "-f", "f32le", "-"], capture_output=True, check=True).stdout
    stereo = np.frombuffer(raw, np.float32).reshape(-1, 2)
    level = np.sqrt(np.convolve(stereo[:, 0] ** 2, np.ones(4800) / 4800, mode="valid"))
    loud = np.flatnonzero(level > 0.5 * level.max())
    middle = (int(loud[0]) + int(loud[-1])) // 2 + 2400             # the tone's middle (its first peak may be near 0)
    steady = stereo[middle - 24000:middle + 24000]                  # a second of the tone
    assert len(steady) == 48000, (loud[0], loud[-1], len(stereo))
    for channel in (0, 1):
        rms = np.sqrt(np.mean(steady[:, channel] ** 2))
        assert 20 * np.log10(rms / (0.5 / np.sqrt(2))) == pytest.approx(0.0, abs=1.0), rms     # its level kept
        spectrum = np.abs(np.fft.rfft(steady[:, channel]))
        assert abs(np.argmax(spectrum) * 48000 / len(steady) - 10000) < 50                    # its band kept


def _tree_rss_mib(pid: int) -> float:
    """RSS (MiB) of every process below `pid` (its engines and their encoders), not `pid` itself."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0) / 1024
        except OSError:
            pass
    return total


@pytest.mark.slow
def test_sessions_share_one_engine_a_second_adds_less_than_half(serving, tmp_path):
    server = serving("--max-live", "2")
    before = _tree_rss_mib(server.proc.pid)
    views = []
    for k in range(2):
        sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / f"{k}.ts")})[1]["id"]
        wait_state(server, sid, ("idle", "streaming"))
        time.sleep(6)
        views.append((sid, _tree_rss_mib(server.proc.pid)))
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert sorted(engine["sessions"]) == sorted(s for s, _ in views)         # one engine carries both
    first, second = views[0][1], views[1][1] - views[0][1]
    assert first > before and second < 0.5 * first, (before, first, second)
    for sid, _ in views:
        assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"


def test_a_session_body_must_say_it_is_json(serve_parts, tmp_path):
    """A body sent as a form (curl -d's default) is refused as such (415), not as "not a JSON object"."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.live.sessions import LiveSessions

    p = serve_parts
    live = LiveSessions(p.dispatcher.handles, p.acceptor.setup, [tmp_path], p.acceptor.avatars, p.events.append)
    client = TestClient(make_app(p.queue, p.acceptor, p.dispatcher, p.metrics, live=live))
    for kind in ("application/x-www-form-urlencoded", None):
        r = client.post("/v1/live", content=b'{"avatar": "anchor"}', headers={"Content-Type": kind} if kind else {})
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"], r.text


def test_an_engine_launched_compiled_takes_no_live_session(tmp_path, monkeypatch):
    """torch.compile's CUDA graphs are kept per thread and each session would compile anew mid-stream: refused in
    words before an engine hears of it."""
    from types import SimpleNamespace

    from ditto_fast.core.errors import UsageError
    from ditto_fast.serve.live.sessions import LiveSessions

    sessions = LiveSessions([], SimpleNamespace(launch="compile"), [tmp_path], avatars=lambda name: None,
                            log=lambda entry: None)
    monkeypatch.setattr(sessions, "check", lambda body: SimpleNamespace(out=None, avatar="anchor"))
    with pytest.raises(UsageError, match="--launch graphs"):
        sessions.open({"avatar": "anchor"})
    assert sessions.list() == []


def test_post_v1_live_keeps_lives_file_rules(serve_parts, tmp_path, monkeypatch):
    """POST /v1/live decides by `live`'s own rules (live/start.py's check_files): yesterday's .ts, playlist or one of
    its segments is refused (400, exit code 2, the file named and the fix) unless the request says "overwrite":
    true (it was replaced without a word); a relative out lies under the first --root, as a job's output does (it
    was taken from the server's own folder)."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.live.sessions import LiveSessions

    p = serve_parts
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    for folder in (first / "live", elsewhere):
        folder.mkdir(parents=True)
    live = LiveSessions(p.dispatcher.handles, p.acceptor.setup, [first, tmp_path], p.acceptor.avatars,
                        p.events.append)
    client = TestClient(make_app(p.queue, p.acceptor, p.dispatcher, p.metrics, live=live))
    (first / "news.ts").write_bytes(b"yesterday's recording")
    (first / "show.m3u8").write_text("#EXTM3U\n#EXTINF:1.0,\nshow_00000.ts\n#EXT-X-ENDLIST\n")
    (first / "late_00007.ts").write_bytes(b"a segment of yesterday's late show")
    for out, there in ((first / "news.ts", first / "news.ts"), (first / "show.m3u8", first / "show.m3u8"),
                       (first / "late.m3u8", first / "late_00007.ts")):
        r = client.post("/v1/live", json={"avatar": "anchor", "out": str(out)})
        answer = r.json()
        assert r.status_code == 400 and answer["exit_code"] == 2, answer
        assert answer["error"].startswith(f"{there}: exists") and 'send "overwrite": true' in answer["error"], answer
    assert (first / "news.ts").read_bytes() == b"yesterday's recording"
    assert live.check({"avatar": "anchor", "out": str(first / "news.ts"), "overwrite": True}).overwrite is True
    r = client.post("/v1/live", json={"avatar": "anchor", "out": str(first / "news.ts"), "overwrite": "yes"})
    assert r.status_code == 400 and "overwrite must be true or false" in r.json()["error"], r.text

    monkeypatch.chdir(elsewhere)                        # the server's own folder is no root
    assert live.check({"avatar": "anchor", "out": "live/today.m3u8"}).out == str(first / "live" / "today.m3u8")
    r = client.post("/v1/live", json={"avatar": "anchor", "out": "news.ts"})
    assert r.status_code == 400 and r.json()["error"].startswith(f"{first / 'news.ts'}: exists"), r.text


@pytest.mark.slow
def test_a_playlist_a_killed_server_left_open_is_closed_at_its_next_start(serving, tmp_path):
    """serve SIGKILLed mid-session leaves its HLS playlist without #EXT-X-ENDLIST (players poll it as live for ever):
    the next start closes it and says so; a session ended cleanly leaves no record behind."""
    import signal

    ENDLIST = "#EXT-X-ENDLIST"                           # the HLS tag (RFC 8216): no more segments will come

    server = serving("--max-live", "1")
    playlist = tmp_path / "show.m3u8"
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(playlist)})[1]["id"]
    wait_state(server, sid, ("idle", "streaming"))
    deadline = time.monotonic() + 120
    while not (playlist.exists() and playlist.read_text().count("#EXTINF") >= 2):
        assert time.monotonic() < deadline, server.log.read_text()[-3000:]
        time.sleep(0.2)
    writers = processes_naming(str(playlist))            # the session's ffmpeg: killed with the rest, as systemd does
    assert writers, "no process writes the playlist"
    for pid in writers:
        os.kill(pid, signal.SIGKILL)
    server.stop(signal.SIGKILL)                          # the server, its engine and their ffmpeg at once
    until_gone(writers)                                  # (killed alone, the engine's ffmpeg may finish a segment)
    left = playlist.read_text()
    assert ENDLIST not in left                           # what a killed server leaves

    again = serving("--max-live", "1")                   # the same home
    assert playlist.read_text() == left.rstrip("\n") + "\n" + ENDLIST + "\n"
    closed = [e for e in _log_lines(again) if e.get("event") == "playlist closed"]
    assert [(e["live"], e["playlist"]) for e in closed] == [(sid, str(playlist))], closed
    listed = [ln for ln in left.splitlines() if ln and not ln.startswith("#")]
    assert all((tmp_path / name).exists() for name in listed)

    records = tmp_path / "home" / "serve" / "live"
    nxt = again.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "next.m3u8")})[1]["id"]
    wait_state(again, nxt, ("idle", "streaming"))
    assert [p.stem for p in records.glob("*.json")] == [nxt]
    assert again.call("DELETE", f"/v1/live/{nxt}")[1]["state"] == "ended"
    deadline = time.monotonic() + 30
    while list(records.glob("*.json")):
        assert time.monotonic() < deadline, list(records.glob("*.json"))
        time.sleep(0.2)
    assert (tmp_path / "next.m3u8").read_text().rstrip().endswith(ENDLIST)
    assert again.stop() == 0


def test_a_session_goes_to_the_engine_carrying_the_fewest_a_dead_one_started_afresh(tmp_path):
    """serve's choice of engine for a session: the one carrying the fewest sessions, though it is dead (an actor
    killed under its session: it is started afresh, not left dead while the other carries two), a live one first
    where they carry as many; one whose start fails passes the session to the next, and says so in the log."""
    from ditto_fast.core.errors import InputError
    from ditto_fast.handles.base import EngineState
    from ditto_fast.live.options import LiveRequest
    from ditto_fast.serve.live.sessions import LiveSessions, ServedSession

    class Engine:
        def __init__(self, name: str, state: str, sessions: int, starts: bool = True):
            self.name, self.starts, self.opened = name, starts, []
            self._state = EngineState(name, "ray", state=state, sessions=[f"s{k}" for k in range(sessions)])

        def state(self) -> EngineState:
            return self._state

        def open_live(self, order, heard=None):
            if self._state.state == "dead" and not self.starts:
                raise InputError(f"{self.name}: its Ray actor did not start")
            self.opened.append(order.label)
            return object()

    log: list[dict] = []
    carrying, dead, idle = Engine("a", "idle", 1), Engine("b", "dead", 0), Engine("c", "idle", 0)
    live = LiveSessions([carrying, dead], None, [tmp_path], lambda name: None, log.append)
    request = LiveRequest(avatar="anchor")
    assert live._carry(ServedSession("one", request, log.append)) is dead and dead.opened == ["one"]
    live.engines = [dead, idle]
    assert live._carry(ServedSession("two", request, log.append)) is idle         # as many: the live one
    lame = Engine("d", "dead", 0, starts=False)
    live.engines = [carrying, lame]
    assert live._carry(ServedSession("three", request, log.append)) is carrying and carrying.opened == ["three"]
    assert log[-1]["event"] == "engine down" and "did not start" in log[-1]["error"], log
