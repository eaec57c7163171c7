"""ditto-fast serve's job API as a hostile client meets it: every answer in the API's error format (unknown routes,
bodies over the limit however they are sent, an internal error), the token checked before a body is read, its
scheme in any case, refusals of a finished job's cancel that say why, no page that needs the internet."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")

from conftest import SERVE_TOKEN  # noqa: E402

BIG = 20 << 20


def _error_format(r) -> dict:
    body = r.json()
    assert set(body) == {"error", "exit_code"} and isinstance(body["error"], str) and body["error"], r.text
    return body


def test_unknown_routes_and_methods_answer_in_the_api_s_error_format(api):
    client, _, _ = api
    for r, status in ((client.get("/v1/nothing"), 404), (client.put("/v1/jobs"), 405),
                      (client.patch("/v1/jobs/abc"), 405), (client.get("/docs"), 404), (client.get("/redoc"), 404)):
        assert r.status_code == status, r.text
        assert _error_format(r)["exit_code"] == 2
    assert client.get("/v1/jobs/nope").status_code == 404 and _error_format(client.get("/v1/jobs/nope"))
    assert client.get("/openapi.json").status_code == 200          # the description stays, without a CDN page


def test_the_token_is_checked_before_the_body_and_its_scheme_in_any_case(api):
    client, queue, _ = api
    for header in ("", "Bearer wrong-token-of-length", f"Basic {SERVE_TOKEN}", SERVE_TOKEN, f"Bearer  {SERVE_TOKEN}x"):
        r = client.post("/v1/jobs", content=b"{not json", headers={"Authorization": header,
                                                                     "Content-Type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (header, r.text)
        assert _error_format(r)["exit_code"] == 2
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert client.get("/v1/jobs", headers={"Authorization": f"{scheme} {SERVE_TOKEN}"}).status_code == 200
    r = client.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in _error_format(r)["error"]
    assert queue.counts()["queued"] == 0


def test_the_token_is_compared_in_constant_time_and_never_logged(api, monkeypatch, capfd):
    import hmac

    from ditto_fast.serve import auth

    client, _, events = api
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append(1)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert client.get("/v1/jobs").status_code == 200
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer nope-nope-nope-nope"}).status_code == 401
    assert len(compared) == 2
    client.post("/v1/jobs", json={"avatar": "nobody", "audio": "a.wav", "output": "a.mp4"})
    out, err = capfd.readouterr()
    assert SERVE_TOKEN not in json.dumps(events) + out + err


def test_job_values_of_the_wrong_kind_are_refused_not_coerced(api, clips, tmp_path):
    client, queue, _ = api
    audio = shutil.copy(clips[0], tmp_path / "a.wav")
    base = {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4")}
    for change, said in (({"priority": True}, "priority"), ({"priority": 1.0}, "priority"),
                         ({"priority": [1]}, "priority"), ({"callback": 5}, "callback"),
                         ({"avatar": 5}, "avatar"), ({"overwrite": "yes"}, "overwrite")):
        r = client.post("/v1/jobs", json={**base, **change})
        assert r.status_code == 400 and said in _error_format(r)["error"], (change, r.text)
    for body in (b"[1]", b'"job"', b"{}", b'{"avatar": "anchor", "avatar": 5', b"\xff\xfe"):
        r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and _error_format(r)["exit_code"] == 2, (body, r.text)
    assert queue.counts()["queued"] == 0


def test_cancelling_a_finished_job_says_why_it_cannot(api, clips, tmp_path):
    client, queue, _ = api
    job = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(shutil.copy(clips[0], tmp_path / "a.wav")),
                                        "output": str(tmp_path / "a.mp4")}).json()
    queue.take()
    queue.finish(job["id"], "done", output=str(tmp_path / "a.mp4"), exit_code=0)
    r = client.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 409 and r.json()["error"] == f"job {job['id']} is done already; there is nothing to cancel"
    assert r.json()["exit_code"] == 2 and r.json()["job"]["status"] == "done"


def test_an_internal_error_answers_in_the_api_s_format(serve_parts, clips, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app

    parts = serve_parts
    client = TestClient(make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics),
                        raise_server_exceptions=False)

    def bug(*args, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(parts.acceptor, "accept", bug)
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": "a.wav", "output": "a.mp4"})
    assert r.status_code == 500 and _error_format(r)["exit_code"] == 1 and "internal error" in r.json()["error"]


# ----------------------------------------------------------------------------- bodies over the limit, on a real socket
@pytest.fixture()
def listening(serve_parts):
    """The API on a real port (uvicorn in a thread): its port."""
    import uvicorn

    from ditto_fast.serve.app import make_app

    parts = serve_parts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics, token=SERVE_TOKEN)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


def _post(port: int, body, token: str | None = SERVE_TOKEN, chunked: bool = False) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    conn.request("POST", "/v1/jobs", body=body, headers=headers, encode_chunked=chunked)
    r = conn.getresponse()
    answer = r.status, json.loads(r.read())
    conn.close()
    return answer


def test_a_body_over_the_limit_is_413_in_the_api_s_format_however_it_is_sent(listening):
    status, body = _post(listening, b"x" * BIG)                                     # with Content-Length
    assert status == 413 and set(body) == {"error", "exit_code"} and "64 KiB" in body["error"], body
    status, body = _post(listening, (b"x" * (1 << 20) for _ in range(BIG >> 20)), chunked=True)
    assert status == 413 and set(body) == {"error", "exit_code"} and "64 KiB" in body["error"], body
    status, body = _post(listening, b"x" * BIG, token=None)                          # no token: 401 first
    assert status == 401 and body["exit_code"] == 2
    status, body = _post(listening, b"{}")
    assert status == 400 and body["exit_code"] == 2


# ----------------------------------------------------------------------------- other sites' pages, rebound names
def _own_app(serve_parts, tmp_path, port: int = 8750, allow: tuple[str, ...] = ()):
    """The API as `serve` makes it in its default set-up (loopback, no token), its Host names set: a client on
    http://127.0.0.1:PORT, and the uploads folder."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.hosts import AllowedHosts
    from ditto_fast.serve.page.api import PageFiles

    parts = serve_parts
    files = PageFiles([tmp_path.resolve()], tmp_path / "uploads", tmp_path / "previews", max_upload=1 << 20)
    app = make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics, files=files,
                   hosts=AllowedHosts("127.0.0.1", port, allow))
    return TestClient(app, base_url=f"http://127.0.0.1:{port}"), files


def test_a_name_rebound_to_this_machine_reads_and_changes_nothing(serve_parts, clips, tmp_path):
    client, files = _own_app(serve_parts, tmp_path, allow=("news.example",))
    for path in ("/v1/settings", "/v1/jobs", "/healthz", "/", "/metrics"):
        r = client.get(path, headers={"Host": "evil.example:8750"})
        assert r.status_code == 421 and "--allow-host" in _error_format(r)["error"], (path, r.text)
        assert b"uploads" not in r.content
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(clips[0]), "output": str(tmp_path / "o.mp4")},
                    headers={"Host": "evil.example:8750"})
    assert r.status_code == 421 and serve_parts.queue.counts()["queued"] == 0
    for host in ("127.0.0.1:8750", "localhost:8750", "[::1]:8750", "LOCALHOST:8750", "news.example",
                 "news.example:443"):
        assert client.get("/v1/settings", headers={"Host": host}).status_code == 200, host
    for host in ("127.0.0.1:9999", "localhost", "127.0.0.1.evil.example:8750", "", "[::1", "a b:8750"):
        assert client.get("/v1/settings", headers={"Host": host}).status_code == 421, host


def test_a_page_of_another_site_changes_nothing_and_a_form_cannot_upload(serve_parts, clips, tmp_path):
    client, files = _own_app(serve_parts, tmp_path)
    wav = clips[0].read_bytes()
    proof = {"X-Requested-With": "ditto-fast"}
    for origin in ("http://evil.example", "null", "http://127.0.0.1:8750.evil.example", "file://",
                   "http://127.0.0.1:9999"):
        r = client.post("/v1/uploads", files={"file": ("a.wav", wav, "audio/wav")}, headers={"Origin": origin, **proof})
        assert r.status_code == 403 and "another site" in _error_format(r)["error"], (origin, r.text)
        r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(clips[0]), "output": str(tmp_path / "o.mp4")},
                        headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
    r = client.post("/v1/uploads", files={"file": ("a.wav", wav, "audio/wav")},
                    headers={"Sec-Fetch-Site": "cross-site", **proof})
    assert r.status_code == 403
    # what a form sends (no header of its own), even from this server's page: refused
    r = client.post("/v1/uploads", files={"file": ("a.wav", wav, "audio/wav")}, headers={"Origin": "http://127.0.0.1:8750"})
    assert r.status_code == 403 and "X-Requested-With" in _error_format(r)["error"]
    assert not files.uploads.exists() or list(files.uploads.iterdir()) == []
    assert serve_parts.queue.counts()["queued"] == 0
    # the page's own requests (its Origin is the server's), and clients that send no Origin (curl), go through
    r = client.post("/v1/uploads", files={"file": ("a.wav", wav, "audio/wav")},
                    headers={"Origin": "http://127.0.0.1:8750", "Sec-Fetch-Site": "same-origin", **proof})
    assert r.status_code == 201, r.text
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": r.json()["path"], "output": str(tmp_path / "o.mp4")},
                    headers={"Origin": "http://127.0.0.1:8750"})
    assert r.status_code == 202, r.text
    assert client.delete(f"/v1/jobs/{r.json()['id']}", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.delete(f"/v1/jobs/{r.json()['id']}").status_code == 200
    assert client.get("/v1/jobs", headers={"Origin": "http://evil.example"}).status_code == 200   # it reads no answer


def test_a_websocket_from_another_site_or_a_rebound_name_is_refused(serve_parts, tmp_path):
    from starlette.testclient import WebSocketDenialResponse
    from starlette.websockets import WebSocketDisconnect

    client, _ = _own_app(serve_parts, tmp_path)
    own = {"Host": "127.0.0.1:8750"}                     # the test client's WebSocket names no host of its own
    for headers, status in (({"Origin": "http://evil.example"}, 403), ({"Host": "evil.example:8750"}, 421),
                            ({"Origin": "null"}, 403)):
        with pytest.raises(WebSocketDenialResponse) as denied:
            with client.websocket_connect("/v1/live/x/audio", headers={**own, **headers}):
                pass
        assert denied.value.status_code == status and _error_format(denied.value)["exit_code"] == 2, headers
    with pytest.raises(WebSocketDisconnect):             # its own origin passes the gate (no such route here)
        with client.websocket_connect("/v1/live/x/audio", headers={**own, "Origin": "http://127.0.0.1:8750"}):
            pass


def test_the_names_a_server_answers_to_follow_its_host():
    from ditto_fast.core.errors import UsageError
    from ditto_fast.serve.hosts import AllowedHosts
    from ditto_fast.serve.options import ServeOptions

    named = AllowedHosts("10.1.2.3", 8750, ["news.example:443"])
    assert named.allows("10.1.2.3:8750") and named.allows("news.example:443")
    assert not named.allows("localhost:8750") and not named.allows("news.example") and not named.allows("10.9.9.9:8750")
    anywhere = AllowedHosts("0.0.0.0", 80)
    assert anywhere.allows("10.9.9.9") and anywhere.allows("localhost") and not anywhere.allows("evil.example")
    with pytest.raises(UsageError, match="--allow-host"):
        ServeOptions(allow_host=["http://news.example/"])
