"""serve --ray: joining the tests' Ray cluster, served bytes equal to render's, a cancel and a lost actor; live
sessions carried by the actors, one each, and an actor killed under its session (on their own file: scripts/test.sh's
workers run the *_ray.py files on one worker, beside one cluster)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from conftest import store_env  # noqa: E402
from support import Server, speech_clip, wait_for_frames  # noqa: E402


@pytest.mark.slow
def test_serve_on_ray_renders_render_s_bytes_cancels_and_survives_a_lost_actor(local_ray, serving, tmp_path, run_cli,
                                                                                tiny_checkpoints):
    """`serve --ray ADDRESS` joining the tests' cluster: one actor, loaded before the server listens."""
    ray = local_ray
    server = serving("--ray", ray.get_runtime_context().gcs_address, "--workers", "1")
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert engine["kind"] == "ray" and engine["state"] == "idle"
    assert ray.get_runtime_context().get_node_id()[:12] in engine["where"]
    audio = speech_clip(tmp_path, "a.wav", 0.8)
    job = server.wait(server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "seed": 3,
                                                       "output": str(tmp_path / "served.mp4")})[1]["id"])
    assert job["status"] == "done" and job["timings"]["frames"] == 20, job
    r = run_cli(["render", "--avatar", "anchor", "--audio", audio, "-o", tmp_path / "rendered.mp4", "--seed", "3",
                 "--device", "cpu", "--quiet"], store_env(tmp_path / "home", tiny_checkpoints))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "served.mp4").read_bytes() == (tmp_path / "rendered.mp4").read_bytes()

    long = speech_clip(tmp_path, "long.wav", 4.0)
    victim = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(long),
                                              "output": str(tmp_path / "victim.mp4")})[1]["id"]
    wait_for_frames(server, victim)
    assert server.call("DELETE", f"/v1/jobs/{victim}")[0] == 202
    assert server.wait(victim)["status"] == "cancelled"
    assert not [p for p in tmp_path.iterdir() if "victim" in p.name]     # nor its part file

    lost = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(long),
                                            "output": str(tmp_path / "lost.mp4")})[1]["id"]
    wait_for_frames(server, lost)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == "ditto-fast" and a["name"].startswith(f"ditto-fast-serve-{server.proc.pid}-")]
    assert len(names) == 1
    ray.kill(ray.get_actor(names[0], namespace="ditto-fast"))         # its node lost, say
    again = server.wait(lost)
    assert again["status"] == "done" and again["attempts"] == 2, again     # on the actor started in its place
    assert server.stop() == 0
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "ditto-fast"]
    # a server started before any avatar is registered (its store not made yet) starts all the same
    fresh = Server(store_env(tmp_path / "fresh", tiny_checkpoints), tmp_path, "--ray",
                   ray.get_runtime_context().gcs_address, "--workers", "1")
    try:
        assert len(fresh.start().call("GET", "/healthz")[1]["engines"]) == 1
    finally:
        assert fresh.stop() == 0


def _talk(server, sid: str, speech) -> list[bytes]:
    """A WebSocket audio client of session `sid` sending the 16 kHz float `speech` as it is spoken (0.5 s ahead) as
    one answer, its frames asked back; the media messages it got up to the frame its playback_finished names (the
    event may come before that frame's encoded picture)."""
    import asyncio
    import json
    import time

    import numpy as np
    import websockets

    async def talk() -> list[bytes]:
        media: list[bytes] = []
        events: list[dict] = []
        pcm = np.round(speech * 32767).astype("<i2")
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/live/{sid}/audio") as ws:
            async def listen():
                async for message in ws:
                    (media.append if isinstance(message, bytes) else events.append)(message)
            reader = asyncio.ensure_future(listen())
            await ws.send(json.dumps({"rate": 16000, "media": True}))
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), 320)):
                await ws.send(pcm[i:i + 320].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - 0.5 - time.monotonic()))
            await ws.send(json.dumps({"end": True}))
            deadline = time.monotonic() + 180
            while not (finished := [e for e in map(json.loads, events) if e.get("event") == "playback_finished"]):
                assert time.monotonic() < deadline, (sid, events)
                await asyncio.sleep(0.1)
            while not media or _header(media[-1])["index"] < finished[0]["frame"]:     # the frame that carried it
                assert time.monotonic() < deadline, (sid, finished, len(media))
                await asyncio.sleep(0.1)
            reader.cancel()
        return media
    return asyncio.run(talk())


def _header(message: bytes) -> dict:
    """A media message's header (its frame's index, key, sizes)."""
    import json
    import struct

    return json.loads(message[4:4 + struct.unpack(">I", message[:4])[0]])


def _media(messages: list[bytes]) -> tuple[list[int], int, float]:
    """What a client's media messages carried: the frames' indices, the pictures their access units decode to, and
    the seconds of speech in their 48 kHz audio."""
    import struct

    import av
    import numpy as np

    decoder = av.CodecContext.create("h264", "r")
    indices, pictures, pcm = [], 0, []
    for m in messages:
        header, n = _header(m), struct.unpack(">I", m[:4])[0]
        unit = m[4 + n:4 + n + header["unit"]]
        indices.append(header["index"])
        pictures += len(decoder.decode(av.Packet(unit))) if unit else 0
        pcm.append(np.frombuffer(m[4 + n + header["unit"]:], "<i2"))
    audio = np.concatenate(pcm).astype(np.float32) / 32768 if pcm else np.zeros(0, np.float32)
    return indices, pictures, _spoken(audio, 48000)


def _spoken(audio, rate: int) -> float:
    """Seconds of `audio` within speech (a tenth of a second around it at least 5% loud samples)."""
    import numpy as np

    if not len(audio):
        return 0.0
    return float((np.convolve(np.abs(audio) > 0.02, np.ones(rate // 10) / (rate // 10), mode="same") > 0.05).sum()
                 / rate)


@pytest.mark.slow
def test_serve_on_ray_carries_live_sessions_one_an_actor_and_a_killed_actor_ends_only_its_own(local_ray, serving,
                                                                                               tmp_path):
    """`serve --ray --workers 2`: two live sessions, each on its own actor (the one carrying the fewest), each
    streaming to its .ts (its frames decoded and counted against what it says it sent and against its audio) and
    its frames back to a WebSocket client through the server (decoded, in order, carrying the speech sent). An actor
    killed under its session ends that session with the cause; the other streams on; the next session opens on a
    fresh actor and streams."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import soundfile as sf
    from test_serve_live import decoded_audio, video_frames     # a stream's frames and audio, as ffmpeg decodes them

    ray = local_ray
    server = serving("--ray", ray.get_runtime_context().gcs_address, "--workers", "2", "--max-live", "3",
                     "--live-idle-timeout", "600")
    engines = server.call("GET", "/healthz")[1]["engines"]
    assert [e["kind"] for e in engines] == ["ray", "ray"] and all(e["state"] == "idle" for e in engines), engines
    speech, _ = sf.read(speech_clip(tmp_path, "s.wav", 2.0), dtype="float32")

    def open_session(name: str) -> dict:
        code, view = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / f"{name}.ts"),
                                                      "max_latency": 3.0, "steps": 2})     # 2 sessions, 2 cores
        assert code == 201, view
        return server.wait(view["id"], ("idle", "streaming", "failed"), 180, kind="live")

    a = open_session("a")
    b = open_session("b")
    assert a["state"] != "failed" and b["state"] != "failed", (a, b)
    assert a["engine"] != b["engine"] and a["pid"] != b["pid"], (a, b)        # one session an actor
    carried = {e["name"]: e["sessions"] for e in server.call("GET", "/healthz")[1]["engines"]}
    assert carried == {a["engine"]: [a["id"]], b["engine"]: [b["id"]]}, carried

    with ThreadPoolExecutor(2) as pool:                # both clients at once
        talks = {s["id"]: pool.submit(_talk, server, s["id"], speech) for s in (a, b)}
        got = {sid: talk.result() for sid, talk in talks.items()}
    said = _spoken(speech, 16000)
    for s in (a, b):
        indices, pictures, spoken = _media(got[s["id"]])
        assert indices and indices == list(range(indices[0], indices[0] + len(indices))), (s, indices)
        assert pictures == len(indices) and abs(spoken - said) < 0.4, (s["id"], pictures, len(indices), spoken, said)

    # a's actor killed under its session (found by its pid: the actor answers ready() with it)
    names = [x["name"] for x in ray.util.list_named_actors(all_namespaces=True)
             if x["namespace"] == "ditto-fast" and x["name"].startswith(f"ditto-fast-serve-{server.proc.pid}-")]
    actors = {ray.get(h.ready.remote())["pid"]: h for n in names for h in [ray.get_actor(n, namespace="ditto-fast")]}
    assert set(actors) == {a["pid"], b["pid"]}, (actors, a, b)
    ray.kill(actors[a["pid"]])
    lost = server.wait(a["id"], ("ended", "failed"), 120, kind="live")
    assert lost["state"] == "failed" and lost["error"].startswith(f"its engine {a['engine']} died ("), lost
    assert "ActorDiedError" in lost["error"] or "RayActorError" in lost["error"], lost["error"]
    assert video_frames(tmp_path / "a.ts")[1] > 0                              # what it streamed stays playable

    # the other streams on
    indices, pictures, spoken = _media(_talk(server, b["id"], speech))
    assert indices and indices == list(range(indices[0], indices[0] + len(indices))) and pictures == len(indices)
    assert abs(spoken - said) < 0.4, (pictures, len(indices), spoken, said)

    # the next session, while b's actor carries b: on a fresh actor in the dead one's place (it carries none)
    c = open_session("c")
    assert c["state"] != "failed" and c["engine"] == a["engine"] and c["pid"] not in (a["pid"], b["pid"]), c
    health = {e["name"]: e for e in server.call("GET", "/healthz")[1]["engines"]}
    assert health[a["engine"]]["restarts"] == 1 and health[a["engine"]]["sessions"] == [c["id"]], health
    assert health[b["engine"]]["sessions"] == [b["id"]], health
    indices, pictures, spoken = _media(_talk(server, c["id"], speech))
    assert indices and indices == list(range(indices[0], indices[0] + len(indices)))
    assert pictures == len(indices) and abs(spoken - said) < 0.4, (pictures, len(indices), spoken, said)

    # ended, each file holds every frame its session sent, at full size
    for s in (b, c):
        code, ended = server.call("DELETE", f"/v1/live/{s['id']}")
        assert code == 200 and ended["state"] == "ended", ended
        size, frames = video_frames(tmp_path / Path(s["out"]).name)
        assert frames == ended["stats"]["frames"]["sent"] and size == "1920x1080", (s["id"], frames, ended["stats"])
        seconds = len(decoded_audio(tmp_path / Path(s["out"]).name)) / 16000
        assert abs(frames - seconds * 25) <= 3, (s["id"], frames, seconds)      # picture and audio as long
    assert server.stop() == 0
    assert not [x for x in ray.util.list_named_actors(all_namespaces=True) if x["namespace"] == "ditto-fast"]
