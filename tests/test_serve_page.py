"""The newsroom page's routes in process: the page open, its JSON under the token; uploads streamed into the
uploads folder (names made safe and unique, the audio checked, the size limited, nothing half-written left); a
job's preview drawn by the dispatcher; outputs and previews served only from the roots and the server's own folder,
path traversal refused."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("python_multipart")

from conftest import SERVE_TOKEN  # noqa: E402


@pytest.fixture()
def page_api(serve_parts, tmp_path):
    """The API with the page's files set: (client with the token, parts, PageFiles); uploads limited to 1 MB."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.page.api import PageFiles

    parts = serve_parts
    files = PageFiles([tmp_path.resolve()], tmp_path / "uploads", tmp_path / "previews", max_upload=1 << 20)
    client = TestClient(make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics, token=SERVE_TOKEN,
                                 files=files))
    client.headers["Authorization"] = "Bearer " + SERVE_TOKEN
    client.headers["X-Requested-With"] = "ditto-fast"          # as the page sends an upload
    return client, parts, files


def test_the_page_loads_without_the_token_but_its_json_needs_it(page_api):
    client, _, _ = page_api
    for path, kind in (("/", "text/html"), ("/page/page.js", "javascript"), ("/page/page.css", "text/css")):
        r = client.get(path, headers={"Authorization": ""})
        assert r.status_code == 200 and kind in r.headers["content-type"], path
        assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "newsroom" in client.get("/").text
    for path in ("/", "/page/page.js", "/page/page.css"):       # nothing fetched from elsewhere
        assert not re.search(r"https?:|//[a-z]|@import", client.get(path).text), path
    for path in ("/v1/avatars", "/v1/profiles", "/v1/settings", "/v1/jobs", "/v1/avatars/anchor/preview"):
        assert client.get(path, headers={"Authorization": ""}).status_code == 401, path
    assert client.post("/v1/uploads", files={"file": ("a.wav", b"RIFF")}, headers={"Authorization": ""}).status_code \
        == 401


def test_avatars_profiles_and_settings_to_choose_from(page_api, tmp_path):
    client, _, _ = page_api
    avatars = client.get("/v1/avatars").json()["avatars"]
    anchor = next(a for a in avatars if a["name"] == "anchor")
    assert anchor["frames"] > 0 and "x" in anchor["resolution"]
    profiles = {p["name"]: p for p in client.get("/v1/profiles").json()["profiles"]}
    assert profiles["web-h264"]["extension"] == ".mp4" and profiles["web-h264"]["loudness"]["lufs"] == -16
    settings = client.get("/v1/settings").json()
    assert settings["uploads"] == str(tmp_path / "uploads") and "neutral" in settings["emotions"]
    r = client.get("/v1/avatars/anchor/preview")
    assert r.status_code == 200 and r.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get("/v1/avatars/anchor/preview").content == r.content       # drawn once, kept


def test_an_upload_is_stored_under_a_safe_unique_name_and_checked_as_audio(page_api, clips, tmp_path):
    client, _, files = page_api
    wav = clips[0].read_bytes()
    paths = []
    for sent in ("../../etc/evil name;rm -rf.wav", "..\\..\\x.wav", ".hidden.wav", ""):
        r = client.post("/v1/uploads", files={"file": (sent, wav, "audio/wav")})
        assert r.status_code == 201, r.text
        path = r.json()["path"]
        paths.append(path)
        stored = files.uploads / os.path.basename(path)
        assert os.path.dirname(path) == str(files.uploads) and stored.read_bytes() == wav
        assert all(c.isalnum() or c in "._-" for c in stored.name) and not stored.name.startswith(".")
    assert len(set(paths)) == 4 and paths[0].endswith("_evil_name_rm_-rf.wav")
    # the path it gives is one a job takes
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": paths[0], "output": str(tmp_path / "o.mp4")})
    assert r.status_code == 202, r.text


def test_a_job_on_an_upload_decodes_it_no_more(page_api, clips, tmp_path, monkeypatch):
    """The upload's check decoded the audio; the job's check (and its render) take that decoding."""
    import ditto_fast.serve.decoded as decoded_module

    client, _, _ = page_api
    path = client.post("/v1/uploads", files={"file": ("news.wav", clips[0].read_bytes(), "audio/wav")}).json()["path"]
    decodes = []
    real = decoded_module.decode_audio          # the server's decodings (in turn with the others)
    monkeypatch.setattr(decoded_module, "decode_audio", lambda p, *limit: decodes.append(p) or real(p, *limit))
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": path, "output": str(tmp_path / "n.mp4")})
    assert r.status_code == 202, r.text
    assert decodes == []
    os.utime(path, ns=(1, 1))                       # the file changed since: decoded again
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": path, "output": str(tmp_path / "m.mp4")})
    assert r.status_code == 202, r.text
    assert [str(p) for p in decodes] == [path]


def test_a_bad_upload_is_refused_in_one_line_and_nothing_is_left(page_api, tmp_path):
    client, _, files = page_api
    before = set(files.uploads.iterdir()) if files.uploads.exists() else set()
    r = client.post("/v1/uploads", files={"file": ("speech.wav", b"not audio at all " * 100, "audio/wav")})
    assert r.status_code == 400 and r.json()["exit_code"] != 0 and "\n" not in r.json()["error"], r.text
    r = client.post("/v1/uploads", files={"other": ("speech.wav", b"RIFF")})
    assert r.status_code == 400 and '"file"' in r.json()["error"]
    r = client.post("/v1/uploads", content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "multipart" in r.json()["error"]
    r = client.post("/v1/uploads", files={"file": ("big.wav", b"\0" * (2 << 20), "audio/wav")})
    assert r.status_code == 413 and "--max-upload-mb" in r.json()["error"]
    assert set(files.uploads.iterdir()) == before           # no temporary, no refused file


def test_an_upload_over_the_limit_without_a_length_is_cut_off(page_api):
    client, _, files = page_api

    def body():
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
        for _ in range(40):
            yield b"\0" * (64 << 10)
        yield b"\r\n--b--\r\n"

    r = client.post("/v1/uploads", content=body(), headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413, r.text
    assert not files.uploads.exists() or list(files.uploads.iterdir()) == []


def _done_job(queue, tmp_path, output) -> str:
    """A job the queue holds as done with `output` (written straight into the queue, as another server might have)."""
    job = queue.submit({"avatar": "anchor", "audio": str(tmp_path / "a.wav"), "output": str(output)})
    queue.take()
    queue.finish(job["id"], "done", output=str(output), exit_code=0)
    return job["id"]


def test_outputs_are_served_only_from_the_roots(page_api, tmp_path, tmp_path_factory):
    client, parts, _ = page_api
    inside = tmp_path / "out" / "clip.mp4"
    inside.parent.mkdir()
    inside.write_bytes(b"the clip's bytes")
    job = _done_job(parts.queue, tmp_path, inside)
    r = client.get(f"/v1/jobs/{job}/output")
    assert r.status_code == 200 and r.content == b"the clip's bytes"
    assert 'filename="clip.mp4"' in r.headers["content-disposition"]
    assert client.get(f"/v1/jobs/{job}").json()["links"] == {"output": f"/v1/jobs/{job}/output"}
    # a job whose output lies outside the roots (a queue written by a server with other roots), or a link out
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.mp4"
    secret.write_bytes(b"not for the page")
    (tmp_path / "out" / "link.mp4").symlink_to(secret)
    for output in (secret, tmp_path / "out" / "link.mp4", tmp_path / ".." / secret.parent.name / "secret.mp4"):
        job = _done_job(parts.queue, tmp_path, output)
        r = client.get(f"/v1/jobs/{job}/output")
        assert r.status_code == 403 and b"not for the page" not in r.content, (output, r.text)
        assert "outside the folders" in r.json()["error"]
    # not done yet: nothing served
    queued = parts.queue.submit({"avatar": "anchor", "audio": str(tmp_path / "a.wav"), "output": str(inside)})
    assert client.get(f"/v1/jobs/{queued['id']}/output").status_code == 409


def test_path_traversal_on_the_routes_finds_nothing(page_api, tmp_path):
    client, _, files = page_api
    files.previews.mkdir(parents=True)
    (tmp_path / "x.png").write_bytes(b"\x89PNG secret")
    for path in ("/v1/jobs/..%2F..%2Fx/preview", "/v1/jobs/..%2Fx/output", "/v1/jobs/%2E%2E/preview",
                 "/v1/jobs/../../x.png", "/v1/avatars/..%2F..%2Fetc/preview", "/v1/avatars/.%2E/preview",
                 "/page/..%2F..%2Fapi.py", "/page/../api.py", "/v1/jobs/0123456789abcdef/preview"):
        r = client.get(path)
        assert r.status_code in (404, 400), (path, r.status_code)
        assert b"secret" not in r.content and b"import" not in r.content, path


@pytest.mark.slow          # real processes end to end
def test_a_rendered_job_gets_its_preview_and_the_page_its_link(page_api, clips, tmp_path):
    client, parts, files = page_api
    parts.dispatcher.previews = files.previews
    audio = shutil.copy(clips[0], tmp_path / "a.wav")
    job = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio),
                                        "output": str(tmp_path / "a.mp4")}).json()
    parts.dispatcher.start()
    try:
        deadline = time.monotonic() + 180
        while (view := client.get(f"/v1/jobs/{job['id']}").json())["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        parts.dispatcher.stop()
    assert view["status"] == "done", view
    assert view["links"]["preview"] == f"/v1/jobs/{job['id']}/preview"
    r = client.get(view["links"]["preview"])
    assert r.status_code == 200 and r.content[:4] == b"\x89PNG"
    assert client.get(f"/v1/jobs/{job['id']}/preview", headers={"Authorization": ""}).status_code == 401


def test_serve_refuses_an_uploads_folder_outside_the_roots(tmp_path, tmp_path_factory, run_cli):
    from support import free_port

    elsewhere = tmp_path_factory.mktemp("elsewhere")
    r = run_cli(["serve", "--root", str(tmp_path), "--uploads", str(elsewhere), "--port", str(free_port())])
    assert r.returncode == 2 and "--uploads folder is outside" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_uploads_go_under_the_first_root_else_the_out_folder_never_a_watch_folder(tmp_path):
    from ditto_fast.serve.options import ServeOptions
    from ditto_fast.serve.server import uploads_default

    assert uploads_default(ServeOptions(roots=[tmp_path / "a", tmp_path / "b"])) == tmp_path / "a" / "uploads"
    watched = ServeOptions(watch=tmp_path / "in", out=tmp_path / "out")
    assert uploads_default(watched) == tmp_path / "out" / "uploads"


def test_an_uploads_folder_swapped_for_a_link_or_moved_out_stores_nothing_outside(page_api, clips, tmp_path,
                                                                                  tmp_path_factory, monkeypatch):
    """The folder is confined as it is written, as a job's paths are when it starts: a link out of the roots put in
    its place while the server runs, or the folder moved out while an upload is written, leaves nothing anywhere."""
    from ditto_fast.serve.page import uploads

    client, _, files = page_api
    wav = clips[0].read_bytes()
    assert client.post("/v1/uploads", files={"file": ("a.wav", wav, "audio/wav")}).status_code == 201
    outside = tmp_path_factory.mktemp("outside")
    files.uploads.rename(tmp_path / "uploads-before")
    files.uploads.symlink_to(outside, target_is_directory=True)
    r = client.post("/v1/uploads", files={"file": ("b.wav", wav, "audio/wav")})
    assert r.status_code == 403 and "outside the folders" in r.json()["error"], r.text
    assert list(outside.iterdir()) == [] and len(list((tmp_path / "uploads-before").iterdir())) == 1
    # moved out of the roots while an upload is written in it: removed, refused
    files.uploads.unlink()
    files.uploads.mkdir()
    real_name = uploads.safe_name

    def moved_out(sent):
        files.uploads.rename(outside / "moved")
        return real_name(sent)

    monkeypatch.setattr(uploads, "safe_name", moved_out)
    r = client.post("/v1/uploads", files={"file": ("c.wav", wav, "audio/wav")})
    assert r.status_code == 403 and "outside the folders" in r.json()["error"], r.text
    assert list((outside / "moved").iterdir()) == []


def _silence(path, seconds: float, length_declared: bool = True):
    """A FLAC of `seconds` of silence (a few hundred bytes a minute); without `length_declared`, its header says
    nothing of its length (STREAMINFO's total samples 0, as a streaming encoder writes)."""
    import subprocess

    import imageio_ffmpeg

    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i",
                    "anullsrc=r=16000:cl=mono", "-t", str(seconds), "-c:a", "flac", str(path)], check=True)
    if not length_declared:
        data = bytearray(path.read_bytes())
        assert data[:4] == b"fLaC"
        data[21] &= 0xF0                        # STREAMINFO's 36 bits of total samples
        data[22:26] = b"\0\0\0\0"
        path.write_bytes(bytes(data))
    return path


def test_a_small_file_of_long_silence_is_refused_before_it_fills_the_server(page_api, tmp_path):
    """A job's audio lasts at most MAX_SPEECH_S: a file whose header says more is refused before it is decoded, one
    whose header says nothing once that much has decoded (bounded chunks): the server never holds more."""
    import tracemalloc

    from ditto_fast.serve.decoded import MAX_SPEECH_S

    client, parts, files = page_api
    assert MAX_SPEECH_S == 3600
    parts.acceptor.decoded.longest = 60.0        # a minute here, for a short test
    declared = _silence(tmp_path / "declared.flac", 600)
    undeclared = _silence(tmp_path / "undeclared.flac", 600, length_declared=False)
    assert declared.stat().st_size < 200_000
    r = client.post("/v1/uploads", files={"file": ("news.flac", declared.read_bytes(), "audio/flac")})
    assert r.status_code == 400 and r.json()["exit_code"] == 3, r.text
    assert "lasts 10.0 min of audio, over the 60.0 s one clip may last" in r.json()["error"], r.text
    tracemalloc.start()
    try:
        r = client.post("/v1/uploads", files={"file": ("news.flac", undeclared.read_bytes(), "audio/flac")})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 400 and "lasts more than 60.0 s" in r.json()["error"], r.text
    assert peak < 20 << 20, peak                 # all of it decoded would be 38 MB, twice over
    assert list(files.uploads.iterdir()) == []
    for audio in (declared, undeclared):         # a job naming such a file on the server: the same refusal
        r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "o.mp4")})
        assert r.status_code == 400 and "one clip may last" in r.json()["error"], r.text


def test_an_upload_into_a_full_disk_is_one_line_naming_the_folder_and_leaves_nothing(page_api, clips, monkeypatch):
    import errno
    import io

    from ditto_fast.serve.page import uploads

    client, _, files = page_api
    real_fdopen = os.fdopen

    class FullDisk(io.RawIOBase):           # the disk fills after 10 KB of the file
        def __init__(self, fd):
            self.raw, self.written = real_fdopen(fd, "wb", buffering=0), 0

        def writable(self):
            return True

        def write(self, data):
            if self.written + len(data) > 10_000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(data)
            return self.raw.write(data)

        def close(self):
            self.raw.close()
            super().close()

    monkeypatch.setattr(uploads.os, "fdopen", lambda fd, mode="r", *a, **kw:
                        io.BufferedWriter(FullDisk(fd)) if mode == "wb" else real_fdopen(fd, mode, *a, **kw))
    r = client.post("/v1/uploads", files={"file": ("news.wav", clips[0].read_bytes(), "audio/wav")})
    assert r.status_code == 507, r.text
    body = r.json()
    assert set(body) == {"error", "exit_code"} and body["exit_code"] == 3 and "\n" not in body["error"]
    assert body["error"].startswith(f"{files.uploads}: no space left") and "--uploads" in body["error"]
    assert list(files.uploads.iterdir()) == []


@pytest.mark.slow          # real processes on the wall clock
def test_an_upload_that_trickles_in_is_cut_off_and_leaves_nothing(serve_parts, tmp_path, monkeypatch):
    """A client sending a byte a second holds neither a connection nor a partial file for longer than a window."""
    import socket
    import threading

    import uvicorn

    from ditto_fast.serve import auth
    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.page.api import PageFiles
    from support import free_port

    monkeypatch.setattr(auth, "BODY_WINDOW_S", 1.0)          # 30 s on a server
    parts, port = serve_parts, free_port()
    files = PageFiles([tmp_path.resolve()], tmp_path / "uploads", tmp_path / "previews")
    server = uvicorn.Server(uvicorn.Config(make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics,
                                                    files=files), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        head = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + b"RIFF" * 100)
        for chunked in (False, True):
            conn = socket.create_connection(("127.0.0.1", port), timeout=15)
            framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: 100000\r\n"
            conn.sendall(b"POST /v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Requested-With: x\r\n"
                         b"Content-Type: multipart/form-data; boundary=b\r\n" + framing + b"\r\n" +
                         (b"%x\r\n%s\r\n" % (len(head), head) if chunked else head))
            t0, answer, held = time.monotonic(), b"", False
            while b"\r\n\r\n" not in answer:          # a byte now and then, until the server answers
                assert time.monotonic() - t0 < 10, "the trickle was never cut off"
                held = held or any(p.name.endswith(".part") for p in files.uploads.glob("*"))
                try:
                    conn.sendall(b"1\r\n0\r\n" if chunked else b"0")
                except OSError:
                    pass
                conn.settimeout(0.3)
                try:
                    answer += conn.recv(65536)
                except TimeoutError:
                    pass
            conn.settimeout(5)
            while (more := conn.recv(65536)):          # the answer, then the connection closed
                answer += more
            conn.close()
            assert answer.startswith(b"HTTP/1.1 408"), answer
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert "too slowly" in body["error"] and body["exit_code"] == 2, body
            assert held and list(files.uploads.iterdir()) == [], "the partial upload"
    finally:
        server.should_exit = True
        thread.join(10)
