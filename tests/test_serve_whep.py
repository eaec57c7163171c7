"""WebRTC out of `serve` by WHEP, as a player uses it: a real server, a real WebRTC peer (aiortc) that offers to receive
video and audio, gets the answer and decodes what comes: the session's picture at its size and rate, its speech;
several viewers of one session; a viewer ended by DELETE; the refusals."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import numpy as np
import pytest

from support import speech_clip

aiortc = pytest.importorskip("aiortc")
websockets = pytest.importorskip("websockets")

pytestmark = pytest.mark.slow


def _post_sdp(server, path: str, sdp: str, kind: str = "application/sdp") -> tuple[int, str, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=sdp.encode(), method="POST",
                                 headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}


async def _watch(server, sid: str, seconds: float, speech: np.ndarray | None = None, delete: bool = False) -> dict:
    """One viewer for `seconds`: what it decoded (frames, their size, audio samples at 48 kHz and their level); with
    `speech`, sent over the session's WebSocket meanwhile."""
    from aiortc import RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver("audio", direction="recvonly")
    got = {"frames": 0, "size": None, "audio": [], "first_frame_at": None}
    tasks = []

    @pc.on("track")
    def on_track(track):
        async def pull():
            while True:
                try:
                    frame = await track.recv()
                except Exception:
                    return
                if track.kind == "video":
                    got["frames"] += 1
                    got["size"] = (frame.width, frame.height)
                    got["first_frame_at"] = got["first_frame_at"] or time.monotonic()
                else:
                    got["audio"].append(frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0].copy())
        tasks.append(asyncio.ensure_future(pull()))

    await pc.setLocalDescription(await pc.createOffer())
    code, answer, headers = await asyncio.to_thread(_post_sdp, server, f"/v1/live/{sid}/whep",
                                                    pc.localDescription.sdp)
    assert code == 201, answer
    assert headers["content-type"].startswith("application/sdp") and "H264" in answer
    got["location"] = headers["location"]
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    if speech is not None:
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/live/{sid}/audio") as ws:
            pcm = np.round(speech * 32767).astype("<i2")
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), 320)):
                await ws.send(pcm[i:i + 320].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - 0.5 - time.monotonic()))
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    else:
        await asyncio.sleep(seconds)
    if delete:                                                      # WHEP's teardown, while it still watches
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}{got['location']}", method="DELETE")
        got["deleted"] = await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=30).status)
    await pc.close()
    for t in tasks:
        t.cancel()
    got["audio"] = np.concatenate(got["audio"]) if got["audio"] else np.zeros(0, np.int16)
    return got


def test_a_session_without_an_output_is_watched_by_webrtc(serving, tmp_path):
    import soundfile as sf

    server = serving()
    code, view = server.call("POST", "/v1/live", {"avatar": "anchor"})
    assert code == 201 and view["whep"] == f"/v1/live/{view['id']}/whep" and view["out"] is None, view
    sid = view["id"]
    speech, _ = sf.read(speech_clip(tmp_path, "s.wav", 3.0), dtype="float32")
    got = asyncio.run(_watch(server, sid, 8.0, speech))
    assert got["size"] == (1920, 1080)
    assert got["frames"] >= 25 * 3, got["frames"]             # several seconds of pictures, decoded
    loud = np.abs(got["audio"].astype(np.float32)) / 32768
    assert loud.max() > 0.05, "the speech came through"
    # two viewers at once; one ended by DELETE
    async def two() -> list[dict]:
        return await asyncio.gather(_watch(server, sid, 4.0, delete=True), _watch(server, sid, 4.0))
    a, b = asyncio.run(two())
    assert a["frames"] >= 25 and b["frames"] >= 25, (a["frames"], b["frames"])
    assert a["deleted"] == 200
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{a['location']}", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as gone:
        urllib.request.urlopen(req, timeout=30)
    assert gone.value.code == 404 and "no viewer" in json.loads(gone.value.read())["error"]
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"


def test_whep_refusals(serving, tmp_path):
    server = serving()
    code, body, _ = _post_sdp(server, "/v1/live/nope/whep", "v=0")
    assert code == 404 and "no live session nope" in json.loads(body)["error"]
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "w.ts")})[1]["id"]
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "v=0", kind="text/plain")
    assert code == 415 and "application/sdp" in json.loads(body)["error"]
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "hello")
    assert code == 400 and "SDP offer" in json.loads(body)["error"]
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n")
    assert code == 409 and "ended" in json.loads(body)["error"]
