"""serve's front door: every answer same-origin only (Cross-Origin-Resource-Policy), the server's decodings taken in
turn (a few at a time, a short line, 503 with Retry-After beyond it) so that its memory stays bounded however many
uploads come at once and is given back after them (measured on a real server from /proc), and /healthz telling an
engine that carries live sessions, and its death under them, from an idle one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import imageio_ffmpeg
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("python_multipart")

from conftest import SERVE_TOKEN  # noqa: E402

HOUR_LINE = "lasts more than 60.0 min of audio, over the 60.0 min one clip may last here"


@pytest.fixture()
def door(serve_parts, tmp_path):
    """The API in process with the page's files under tmp_path: (client with the token, parts, PageFiles)."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.page.api import PageFiles

    files = PageFiles([tmp_path.resolve()], tmp_path / "uploads", tmp_path / "previews", max_upload=1 << 20)
    client = TestClient(make_app(serve_parts.queue, serve_parts.acceptor, serve_parts.dispatcher,
                                 serve_parts.metrics, token=SERVE_TOKEN, files=files),
                        raise_server_exceptions=False)
    client.headers["Authorization"] = "Bearer " + SERVE_TOKEN
    client.headers["X-Requested-With"] = "ditto-fast"
    return client, serve_parts, files


# ----------------------------------------------------------------------------- same origin only
def test_every_answer_is_for_this_server_s_own_pages_only(door, tmp_path, monkeypatch):
    """A foreign page may not embed a preview, an output or any JSON (a token-less server's included): every answer,
    a route's, a file, the page, a refusal, the gate's own, an unknown route's and an internal error's, says
    Cross-Origin-Resource-Policy: same-origin."""
    client, parts, files = door
    job = parts.queue.submit({"avatar": "anchor", "audio": str(tmp_path / "a.wav"), "output": str(tmp_path / "o.mp4")})
    parts.queue.take()
    parts.queue.finish(job["id"], "done", output=str(tmp_path / "o.mp4"), exit_code=0)
    files.previews.mkdir(parents=True)
    files.job_preview(job["id"]).write_bytes(b"\x89PNG\r\n\x1a\n a preview")
    answers = {
        "json": client.get("/v1/jobs"),
        "preview": client.get(f"/v1/jobs/{job['id']}/preview"),
        "page": client.get("/"),
        "script": client.get("/page/page.js"),
        "refusal": client.post("/v1/jobs", json={"avatar": "anchor"}),
        "no such route": client.get("/v1/nothing-here"),
        "no token": client.get("/v1/jobs", headers={"Authorization": ""}),
        "foreign page": client.post("/v1/jobs", json={}, headers={"Origin": "https://evil.example"}),
        "health": client.get("/healthz"),       # 503: the dispatch thread is not started here
    }
    monkeypatch.setattr(parts.dispatcher, "health", lambda: 1 / 0)
    answers["internal error"] = client.get("/healthz")
    expected = {"json": 200, "preview": 200, "page": 200, "script": 200, "refusal": 400, "no such route": 404,
                "no token": 401, "foreign page": 403, "health": 503, "internal error": 500}
    assert {k: r.status_code for k, r in answers.items()} == expected
    assert answers["preview"].headers["content-type"] == "image/png"
    for what, r in answers.items():
        assert r.headers.get("cross-origin-resource-policy") == "same-origin", (what, dict(r.headers))
        assert r.headers.get_list("x-content-type-options") == ["nosniff"], (what, dict(r.headers))


# ----------------------------------------------------------------------------- decodings in turn
def test_decodings_beyond_the_line_are_answered_503_with_retry_after(door, clips, tmp_path):
    """With every decoder taken and its line full, an upload and a job are each answered at once: 503, one line,
    Retry-After; the upload is not kept. Once a decoder is free the same requests go through."""
    from ditto_fast.serve.decoded import Decoders

    client, parts, files = door
    decoded = parts.acceptor.decoded
    decoded.decoders = Decoders(at_once=1, line=0)
    wav = clips[0].read_bytes()
    (tmp_path / "take.wav").write_bytes(wav)
    job = {"avatar": "anchor", "audio": str(tmp_path / "take.wav"), "output": str(tmp_path / "o.mp4")}
    with decoded.decoders.turn():
        upload = client.post("/v1/uploads", files={"file": ("take.wav", wav, "audio/wav")})
        queued = client.post("/v1/jobs", json=job)
    for r in (upload, queued):
        assert r.status_code == 503, r.text
        body = r.json()
        assert set(body) == {"error", "exit_code"} and body["exit_code"] == 2 and "\n" not in body["error"]
        assert "decodes 1 audio files at a time and all are taken" in body["error"], body
        assert int(r.headers["retry-after"]) > 0
    assert not files.uploads.exists() or list(files.uploads.iterdir()) == []
    assert parts.queue.counts()["queued"] == 0
    assert client.post("/v1/uploads", files={"file": ("take.wav", wav, "audio/wav")}).status_code == 201
    assert client.post("/v1/jobs", json=job).status_code == 202


def test_a_request_waits_its_turn_in_line_and_a_patient_caller_as_long_as_it_takes(clips):
    """One decoder, a line of one: the first in line waits and is decoded once the decoder is free; a second in line
    is answered busy; past the wait a request in line is answered busy; the render's check (patient) waits."""
    from ditto_fast.serve.decoded import DecodedMemo, Decoders, DecodersBusy

    memo = DecodedMemo(decoders=Decoders(at_once=1, line=1, wait_s=600))
    results: dict[str, object] = {}

    def decode(name: str, patient: bool = False) -> None:
        try:
            results[name] = memo.decode(clips[0], patient=patient).seconds
        except DecodersBusy as e:
            results[name] = e

    def until(condition) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    with memo.decoders.turn():
        first = threading.Thread(target=decode, args=("first",))
        first.start()
        until(lambda: memo.decoders.waiting == 1)
        decode("second")
        patient = threading.Thread(target=decode, args=("patient", True))
        patient.start()
        until(lambda: memo.decoders.waiting == 2)       # the patient one waits beyond the line
        assert "first" not in results and "patient" not in results
    first.join(60)
    patient.join(60)
    assert isinstance(results["second"], DecodersBusy) and "1 more wait in line" in str(results["second"])
    assert results["first"] == results["patient"] == pytest.approx(0.4, abs=0.01)
    assert memo.decoders.running == memo.decoders.waiting == 0
    memo.decoders.wait_s = 0.05
    with memo.decoders.turn():
        decode("late")
    assert isinstance(results["late"], DecodersBusy) and "none came free in 0.05 s" in str(results["late"])


# ----------------------------------------------------------------------------- memory, on a real server
def _rss(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of process `pid`, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


@pytest.fixture(scope="module")
def silence_bomb(tmp_path_factory) -> Path:
    """Two hours of 48 kHz stereo silence as a FLAC of a few hundred KB written through a pipe, so that its header
    declares no length (STREAMINFO's total samples 0): only decoding it finds its length."""
    path = tmp_path_factory.mktemp("bomb") / "silence.flac"
    with open(path, "wb") as out:
        subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i",
                        "anullsrc=r=48000:cl=stereo", "-t", "7200", "-c:a", "flac", "-frame_size", "16384",
                        "-f", "flac", "pipe:"], stdout=out, check=True)
    head = path.read_bytes()[:42]
    info = int.from_bytes(head[18:26], "big")
    assert head[:4] == b"fLaC" and info >> 44 == 48000 and info & ((1 << 36) - 1) == 0     # no length declared
    assert path.stat().st_size < 1 << 20
    return path


def _upload(port: int, name: str, data: bytes) -> tuple[int, dict, dict]:
    """POST the file to /v1/uploads as the page does: (status, body, headers)."""
    import http.client

    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: audio/flac\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/uploads", body, {"Content-Type": f"multipart/form-data; boundary={boundary}",
                                               "X-Requested-With": "ditto-fast"})
    r = conn.getresponse()
    answer = r.status, json.loads(r.read()), dict(r.getheaders())
    conn.close()
    return answer


@pytest.mark.slow          # a real server; six hours of audio decoded
def test_uploads_of_hours_of_silence_at_once_keep_the_server_s_memory_bounded_and_give_it_back(serving,
                                                                                             silence_bomb):
    """Six small FLACs of hours of silence with no length in their header, uploaded at once: each is refused with
    the one-hour line; the server (the process that decodes them) never holds more than two decodings (an hour of
    16 kHz float32 is 230 MB each), and afterwards is back near where it started. Before, all six decoded at once
    (1.5 GB over) and the memory stayed with the process."""
    server = serving()
    pid = server.proc.pid
    data = silence_bomb.read_bytes()
    assert server.call("GET", "/v1/jobs")[0] == 200               # the routes' first answers made
    baseline = _rss(pid)["VmRSS"]
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")         # VmHWM from here on
    except OSError:
        pass
    answers: list = [None] * 6

    def send(i: int) -> None:
        answers[i] = _upload(server.port, f"bomb{i}.flac", data)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    after = _rss(pid)
    over_peak, over_after = after["VmHWM"] - baseline, after["VmRSS"] - baseline
    print(f"serve rss: baseline {baseline >> 20} MB, peak +{over_peak >> 20} MB, after +{over_after >> 20} MB")
    for status, body, _ in answers:
        assert status == 400 and body["exit_code"] == 3 and HOUR_LINE in body["error"], body
    assert over_peak < 600 << 20, f"peak {over_peak >> 20} MB over the baseline"
    assert over_after < 100 << 20, f"{over_after >> 20} MB over the baseline kept after the uploads"
    uploads = server.call("GET", "/healthz")                      # still answering, nothing left in uploads/
    assert uploads[0] == 200
    assert not any(p.suffix == ".flac" for p in (Path(server.args[server.args.index("--root") + 1])).rglob("*"))


@pytest.mark.slow          # a process of its own, an hour decoded
def test_a_refused_decoding_gives_its_memory_back(silence_bomb):
    """The bounded decoding of a file that turns out too long leaves the process where it was (it held an hour of
    samples, 230 MB, in chunks the heap kept)."""
    script = ("import sys; from ditto_fast.audio.decode import decode_audio\n"
              "from ditto_fast.core.errors import InputError\n"
              "def rss(): return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
              "before = rss()\n"
              "try: decode_audio(sys.argv[1], 3600.0)\n"
              "except InputError as e: print(e, file=sys.stderr)\n"
              "print(rss() - before)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", script, str(silence_bomb)], capture_output=True, text=True, env=env,
                         check=True)
    assert HOUR_LINE in run.stderr, run.stderr
    assert int(run.stdout) < 40 << 10, f"{int(run.stdout) >> 10} MB kept"


# ----------------------------------------------------------------------------- /healthz and live sessions
def _engine(**fields) -> dict:
    return {"name": "engine-0", "kind": "process", "state": "idle", "job": None, "sessions": [], "restarts": 0,
            "last_death": None, "error": None, **fields}


def test_health_tells_an_engine_carrying_sessions_from_an_idle_one():
    from ditto_fast.serve.health import engine_view

    assert engine_view(_engine())["state"] == "idle" and engine_view(_engine())["activity"] == "idle"
    streaming = engine_view(_engine(sessions=["a1", "b2"]))
    assert streaming["state"] == "streaming" and streaming["activity"] == "carrying 2 live sessions"
    both = engine_view(_engine(state="busy", job="0123", sessions=["a1"]))
    assert both["state"] == "busy" and both["activity"] == "rendering job 0123, carrying 1 live session"


@pytest.mark.slow          # a real server, a live session, its engine killed
def test_health_names_an_engine_streaming_and_its_death_while_carrying_a_session(serving, tmp_path):
    server = serving()
    code, view = server.call("POST", "/v1/live", {"avatar": "anchor", "out": str(tmp_path / "carried.ts")})
    assert code == 201, view
    sid = view["id"]
    server.wait(sid, ("idle", "streaming"), 120, kind="live")
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert engine["state"] == "streaming" and engine["activity"] == "carrying 1 live session", engine
    os.kill(int(engine["where"].split()[1]), signal.SIGKILL)
    failed = server.wait(sid, ("ended", "failed"), 60, kind="live")
    assert failed["state"] == "failed" and "died" in failed["error"], failed
    deadline = time.monotonic() + 120
    while (engine := server.call("GET", "/healthz")[1]["engines"][0])["last_death"] is None:
        assert time.monotonic() < deadline, engine
        time.sleep(0.2)
    assert engine["last_death"].startswith("died while carrying 1 live session ("), engine
    assert "SIGKILL" in engine["last_death"] and "idle" not in engine["last_death"], engine
