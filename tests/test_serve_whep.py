"""WebRTC out of `serve` by WHEP, as a player uses it: a real server, a real WebRTC peer (aiortc) that offers to receive
video and audio, gets the answer and decodes what comes: the session's picture at its size and rate, its speech (every
second of it, counted, at its level); several viewers of one session; a viewer ended by DELETE; the refusals. Quick:
the audio cut in 20 ms Opus frames; the viewers' slots (taken before any await, dropped when never connected), the
offers answered or refused in words, on the registry with a session stand-in."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fractions import Fraction

from support import speech_clip

aiortc = pytest.importorskip("aiortc")
websockets = pytest.importorskip("websockets")


# ----------------------------------------------------------------------------- quick: the audio's 20 ms frames
@pytest.mark.parametrize("rate", [Fraction(25), Fraction(30), Fraction(30000, 1001)])
def test_each_frame_s_audio_is_cut_in_20_ms_opus_frames_with_consecutive_pts(rate):
    """aiortc's Opus encoder makes one packet of each 960 samples and gives a frame's packets one RTP timestamp: a
    40 ms frame's second packet is discarded by every receiver. So each frame's slot is cut in 960-sample pieces,
    pts consecutive, the remainder (30 fps: 1600 samples a frame) carried into the next; no sample lost or doubled,
    and a frame's audio starts at its picture's time."""
    from ditto_fast.serve.live.whep import OPUS_SAMPLES, AudioSlices

    assert OPUS_SAMPLES == 960
    first = 1000                                    # a viewer joins a session already streaming
    slots = [(i * 16000 * rate.denominator // rate.numerator) * 3 for i in range(first, first + 101)]  # as session.py
    sent, pieces, slices = [], [], AudioSlices(rate)
    counter = 0
    for k, i in enumerate(range(first, first + 100)):
        n = slots[k + 1] - slots[k]
        pcm = ((np.arange(counter, counter + n) % 65536) - 32768).astype(np.int16)    # every sample its own value
        counter += n
        sent.append(pcm)
        got = slices.add(i, pcm)
        pieces += got
        held = counter - len(pieces) * 960
        assert 0 <= held < 960, (i, held)           # whatever is whole goes at once; the rest waits
    assert all(len(p) == 960 and p.dtype == np.int16 for _, p in pieces)
    pts = [t for t, _ in pieces]
    start = first * 48000 * rate.denominator // rate.numerator
    assert abs(pts[0] - slots[0]) <= 2 and pts[0] == start          # a frame's audio at its picture's time
    assert pts == list(range(start, start + 960 * len(pieces), 960))
    whole = np.concatenate(sent)
    assert np.array_equal(np.concatenate([p for _, p in pieces]), whole[:960 * len(pieces)])
    assert counter - 960 * len(pieces) < 960


def test_frames_a_viewer_missed_leave_their_gap_in_the_audio():
    """A viewer that fell behind skips frames: the audio after them starts at its own frame's time (pts), not
    where the last piece ended, so sound and picture stay in step."""
    from ditto_fast.serve.live.whep import AudioSlices

    slices = AudioSlices(Fraction(30))
    got = slices.add(0, np.ones(1600, np.int16)) + slices.add(1, np.ones(1600, np.int16))
    assert [t for t, _ in got] == [0, 960, 1920]                   # 320 samples held
    got = slices.add(5, np.full(1600, 7, np.int16))                 # frames 2-4 missed: the held 320 dropped
    assert [t for t, _ in got] == [5 * 1600] and (got[0][1] == 7).all()
    assert [t for t, _ in slices.add(6, np.full(1600, 7, np.int16))] == [5 * 1600 + 960, 5 * 1600 + 1920]


def _post_sdp(server, path: str, sdp: str, kind: str = "application/sdp") -> tuple[int, str, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=sdp.encode(), method="POST",
                                 headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}


async def _watch(server, sid: str, seconds: float, speech: np.ndarray | None = None, delete: bool = False,
                 rate: int = 16000, until=None) -> dict:
    """One viewer for `seconds` (and then until `until(got)`, within 180 s): what it decoded (frames, their size,
    audio samples at 48 kHz and their level, the monotonic time of its first and last audio frame and the longest
    wait between two); with `speech` (float at `rate`), sent over the session's WebSocket meanwhile, once the first
    picture came."""
    from aiortc import RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver("audio", direction="recvonly")
    got = {"frames": 0, "size": None, "audio": [], "first_frame_at": None, "longest_wait": 0.0}
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
                    assert frame.sample_rate == 48000
                    got["audio"].append(frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0].copy())
                    now = time.monotonic()
                    if "audio_to" in got:
                        got["longest_wait"] = max(got["longest_wait"], now - got["audio_to"])
                    got["audio_from"] = got.get("audio_from") or now
                    got["audio_to"] = now
        tasks.append(asyncio.ensure_future(pull()))

    await pc.setLocalDescription(await pc.createOffer())
    code, answer, headers = await asyncio.to_thread(_post_sdp, server, f"/v1/live/{sid}/whep",
                                                    pc.localDescription.sdp)
    assert code == 201, answer
    assert headers["content-type"].startswith("application/sdp") and "H264" in answer
    got["location"] = headers["location"]
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    if speech is not None:
        deadline = time.monotonic() + 60
        while not got["frames"]:
            assert time.monotonic() < deadline, "no picture came in 60 s"
            await asyncio.sleep(0.05)
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/live/{sid}/audio") as ws:
            if rate != 16000:
                await ws.send(json.dumps({"rate": rate}))
            pcm, step = np.round(speech * 32767).astype("<i2"), rate // 50
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), step)):
                await ws.send(pcm[i:i + step].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - 0.5 - time.monotonic()))
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    else:
        await asyncio.sleep(seconds)
    deadline = time.monotonic() + 180
    while until is not None and not until(got):
        assert time.monotonic() < deadline, (f"not yet after 180 s: {until.__doc__} ({got['frames']} frames, "
                                             f"{sum(map(len, got['audio'])) / 48000:.2f} s of audio)")
        await asyncio.sleep(0.2)
    if delete:                                                      # WHEP's teardown, while it still watches
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}{got['location']}", method="DELETE")
        got["deleted"] = await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=30).status)
    await pc.close()
    for t in tasks:
        t.cancel()
    got["audio"] = np.concatenate(got["audio"]) if got["audio"] else np.zeros(0, np.int16)
    return got


# ----------------------------------------------------------------------------- quick: the viewers' registry
class _Link:
    """The engine link of a session stand-in: who watches (the registry asks nothing else of it)."""

    def __init__(self) -> None:
        self.watching = 0

    def watch(self, take):
        self.watching += 1

        def leave() -> None:
            self.watching -= 1
        return leave


class _Session:
    """What WhepViewers reads of a served session: its id, state and frame rate, and its engine link."""

    def __init__(self) -> None:
        self.id, self.active, self.state, self.rate, self.link = "s1", True, "streaming", Fraction(25), _Link()


async def _offer_sdp(*kinds: str) -> str:
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    for kind in kinds:
        pc.addTransceiver(kind, direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def test_fifty_offers_at_once_take_sixteen_slots_and_the_unconnected_are_dropped():
    """The cap holds however many offers come at once (the slot is taken before the answer is awaited); an offer
    whose connection is never made (nobody answers its ICE) gives its slot back after the deadline."""
    from ditto_fast.serve.live.whep import MAX_VIEWERS, ViewersFull, WhepViewers

    async def run() -> tuple[list, int, int, int]:
        viewers, session = WhepViewers(connect_s=1.0), _Session()
        sdp = await _offer_sdp("video", "audio")
        got = await asyncio.gather(*[viewers.offer(session, sdp) for _ in range(50)], return_exceptions=True)
        taken = viewers.count("s1")
        deadline = time.monotonic() + 60
        while viewers.count("s1") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        left, watching = viewers.count("s1"), session.link.watching
        await viewers.close()
        return got, taken, left, watching

    got, taken, left, watching = asyncio.run(run())
    answered = [g for g in got if isinstance(g, tuple)]
    full = [g for g in got if isinstance(g, ViewersFull)]
    assert len(answered) == MAX_VIEWERS == taken and len(full) == 50 - MAX_VIEWERS, got
    assert "16 viewers already" in str(full[0]) and full[0].retry_after > 0
    assert left == 0 and watching == 0                 # never connected: dropped, and the engine told


def test_offers_answered_or_refused_in_words():
    """A video-only offer (a monitor without sound) is answered with video alone; an offer with no video, one
    without H.264, a malformed line, a truncated offer: refused in one line that names the problem."""
    from ditto_fast.core.errors import UsageError
    from ditto_fast.serve.live.whep import WhepViewers

    async def run() -> tuple[str, dict]:
        viewers, session = WhepViewers(), _Session()
        _, answer = await viewers.offer(session, await _offer_sdp("video"))
        full = await _offer_sdp("video", "audio")
        said = {}
        for name, sdp in {"audio only": await _offer_sdp("audio"),
                          "no H.264": full.replace("H264/90000", "VP9/90000"),
                          "bad media line": re.sub(r"(m=video \d+ UDP/TLS/RTP/SAVPF)[ \d]*", r"\1", full),
                          "truncated": full[:len(full) // 2],
                          "not SDP": "hello"}.items():
            with pytest.raises(UsageError) as e:
                await viewers.offer(session, sdp)
            said[name] = str(e.value)
        await viewers.close()
        return answer, said

    answer, said = asyncio.run(run())
    media = [line.split()[0] for line in answer.split("\r\n") if line.startswith("m=")]
    assert media == ["m=video"] and "H264/90000" in answer, answer
    assert "no video" in said["audio only"] and "H.264" in said["no H.264"]
    assert "line" in said["bad media line"] and "m=KIND" in said["bad media line"], said
    assert "section lacks" in said["truncated"] and "not an SDP offer" in said["not SDP"], said
    for line in said.values():
        assert "\n" not in line and "Error" not in line and line.rstrip().endswith(("Content-Type: application/sdp",
                                                                                    "receives",
                                                                                    "for 'audio')")), line


@pytest.mark.slow
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


def _tone_windows(pcm: np.ndarray) -> tuple[np.ndarray, float]:
    """Which 20 ms windows of 48 kHz audio carry the tone (RMS over half the loudest window's) and their mean RMS."""
    x = pcm.astype(np.float64)[:len(pcm) // 960 * 960].reshape(-1, 960) / 32768
    rms = np.sqrt((x ** 2).mean(axis=1))
    loud = rms > rms.max() / 2
    return loud, float(rms[loud].mean())


def _ts_audio(path) -> np.ndarray:
    """The .ts file's sound, decoded: int16 mono at 48 kHz."""
    import av

    with av.open(str(path)) as f:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=48000)
        out = [r.to_ndarray().reshape(-1) for frame in f.decode(audio=0) for r in resampler.resample(frame)]
    return np.concatenate(out)


@pytest.mark.slow
@pytest.mark.parametrize("fps", [25, 30])
def test_a_viewer_hears_every_second_of_the_speech_at_its_level(serving, tmp_path, fps):
    """A 440 Hz tone sent to a session with a .ts of its own: an aiortc viewer receives one second of audio for each
    second of picture, and hears the whole tone at the .ts's level (aiortc's Opus encoder once gave each 40 ms
    frame's two 20 ms packets one RTP timestamp; receivers discarded one of each: half the speech)."""
    server = serving()
    ts = tmp_path / "w.ts"
    code, view = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(ts), "fps": fps})
    assert code == 201, view
    sid = view["id"]
    t = np.arange(int(6.0 * 48000)) / 48000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    tone[:4800] *= np.linspace(0, 1, 4800, dtype=np.float32)            # no click at its ends
    tone[-4800:] *= np.linspace(1, 0, 4800, dtype=np.float32)
    def past_the_tone(got: dict) -> bool:
        """the viewer has had 7 s of audio since the tone began"""
        pcm = np.concatenate(got["audio"]) if got["audio"] else np.zeros(0, np.int16)
        loud = np.flatnonzero(np.abs(pcm) > 0.15 * 32768)
        return len(loud) > 0 and len(pcm) - loud[0] > 7 * 48000

    got = asyncio.run(_watch(server, sid, 7.0, tone, rate=48000, until=past_the_tone))
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    heard = len(got["audio"]) / 48000
    pictures = got["frames"] / fps
    watched = got["audio_to"] - got["audio_from"]
    print(f"{fps} fps: {heard:.2f} s of audio for {pictures:.2f} s of picture ({got['frames']} frames), "
          f"{watched:.2f} s watched, {1000 * got['longest_wait']:.0f} ms the longest wait for audio")
    # was 0.5 at 25 fps, 0.6 at 30. Audio that came with waits of over half a second came from a host too busy to
    # send evenly, to a viewer as starved: there the bound is 95 % (97.6 % came at 30 fps on a loaded host)
    assert heard >= (0.98 if got["longest_wait"] < 0.5 else 0.95) * pictures, (heard, pictures, got["longest_wait"])
    deadline = time.monotonic() + 60
    while server.call("GET", f"/v1/live/{sid}")[1]["state"] not in ("ended", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    viewer, level = _tone_windows(got["audio"])
    whole, ts_level = _tone_windows(_ts_audio(ts))
    assert whole.sum() >= 2 * 50, whole.sum()                   # the .ts has the tone (seconds of it, at the least)
    # the viewer's 20 ms windows against the .ts's, from the tone's onset in each: the same windows carry it
    a, b = viewer[np.argmax(viewer):], whole[np.argmax(whole):]
    n = min(len(a), len(b))
    assert n >= 3 * 50 and (a[:n] != b[:n]).sum() <= 0.02 * n + 2, (n, (a[:n] != b[:n]).sum())
    assert abs(20 * np.log10(level / ts_level)) < 1.0, (level, ts_level)               # at its level


@pytest.mark.slow
def test_whep_refusals(serving, tmp_path):
    """An unknown session, another content type, a body that is not SDP, a malformed line, an SDP over the body's
    limit: each refused in a line that names it; a video-only offer answered; the cap under offers at once (503,
    Retry-After) and its slots given back when nobody connects; an ended session's offer 409."""
    server = serving()
    code, body, _ = _post_sdp(server, "/v1/live/nope/whep", "v=0")
    assert code == 404 and "no live session nope" in json.loads(body)["error"]
    sid = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "w.ts")})[1]["id"]
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "v=0", kind="text/plain")
    assert code == 415 and "application/sdp" in json.loads(body)["error"]
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "hello")
    assert code == 400 and "SDP offer" in json.loads(body)["error"]
    offer = asyncio.run(_offer_sdp("video", "audio"))
    bad = re.sub(r"(m=video \d+ UDP/TLS/RTP/SAVPF)[ \d]*", r"\1", offer)       # aiortc: a bare AssertionError
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", bad)
    said = json.loads(body)["error"]
    assert code == 400 and "line 7" in said and "m=video" in said and "Error" not in said, said
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", offer + "a=x-padding:" + "x" * (70 << 10) + "\r\n")
    said = json.loads(body)["error"]
    assert code == 413 and "SDP offer" in said and "job" not in said, said
    # a monitor without sound: answered with video alone
    code, answer, _ = _post_sdp(server, f"/v1/live/{sid}/whep", asyncio.run(_offer_sdp("video")))
    assert code == 201 and [m.split()[0] for m in answer.split("\r\n") if m.startswith("m=")] == ["m=video"]
    # offers at once past the cap: 16 answered, the rest 503 with Retry-After; none connects, and after the
    # deadline every slot is free again
    with ThreadPoolExecutor(24) as pool:
        got = list(pool.map(lambda _: _post_sdp(server, f"/v1/live/{sid}/whep", offer), range(24)))
    assert sorted(code for code, _, _ in got) == [201] * 15 + [503] * 9, [(c, b[:80]) for c, b, _ in got]
    full = [(json.loads(b)["error"], h) for c, b, h in got if c == 503]
    assert "16 viewers already" in full[0][0] and int(full[0][1]["retry-after"]) > 0, full[0]
    assert server.call("GET", f"/v1/live/{sid}")[1]["viewers"] == 16
    deadline = time.monotonic() + 120
    while server.call("GET", f"/v1/live/{sid}")[1]["viewers"]:
        assert time.monotonic() < deadline, "viewers that never connected still hold their slots"
        time.sleep(0.5)
    assert _post_sdp(server, f"/v1/live/{sid}/whep", offer)[0] == 201
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
    code, body, _ = _post_sdp(server, f"/v1/live/{sid}/whep", "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n")
    assert code == 409 and "ended" in json.loads(body)["error"]
