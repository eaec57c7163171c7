"""ditto-fast serve: the durable queue, the job API (in process and as a real server on a real port), the watch
folder, priorities, cancelling, callbacks, a SIGKILL and restart, and served bytes equal to render's."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from conftest import store_env  # noqa: E402
from ditto_fast.serve.jobs.queue import JobQueue  # noqa: E402
from support import Receiver, Server, free_port, gone_lease, speech_clip, wait_for_frames  # noqa: E402


# ----------------------------------------------------------------------------- the queue
def test_the_queue_runs_breaking_jobs_first_and_requeues_a_killed_servers_running_job(tmp_path):
    q = JobQueue(tmp_path / "jobs.sqlite", gone_lease())
    a = q.submit({"avatar": "a"})
    b = q.submit({"avatar": "b"})
    news = q.submit({"avatar": "news"}, priority=100)
    assert q.take()["id"] == news["id"]
    q.finish(news["id"], "done", exit_code=0)
    assert q.take()["id"] == a["id"]                   # running when the server is killed
    again = JobQueue(tmp_path / "jobs.sqlite")         # the next start
    assert [j["id"] for j in again.recover()] == [a["id"]]
    assert [again.get(j["id"])["status"] for j in (a, b, news)] == ["queued", "queued", "done"]
    assert again.cancel(b["id"]) == "queued" and again.get(b["id"])["status"] == "cancelled"
    assert again.cancel(b["id"]) == "cancelled" and again.cancel("nope") is None
    assert again.take()["id"] == a["id"] and again.take() is None
    assert again.get(a["id"])["attempts"] == 2 and again.counts() == {"queued": 0, "running": 1, "done": 1, "failed": 0,
                                                                      "cancelled": 1}


def test_priorities_and_callbacks_are_checked():
    from ditto_fast.core.errors import UsageError
    from ditto_fast.serve.jobs.accept import check_callback, parse_priority
    from ditto_fast.serve.jobs.callbacks import CallbackPolicy, parse_networks

    assert [parse_priority(p) for p in (None, "normal", "breaking", 7)] == [0, 0, 100, 7]
    for bad in ("urgent", 10**6, True, 1.5):
        with pytest.raises(UsageError):
            parse_priority(bad)
    loopback = CallbackPolicy(parse_networks(["127.0.0.0/8"]))
    assert check_callback("http://127.0.0.1:9/x", loopback) == "http://127.0.0.1:9/x"
    for bad in ("file:///etc/passwd", "ftp://x/y", "http://", 5):
        with pytest.raises(UsageError):
            check_callback(bad, loopback)


def test_a_checked_job_s_audio_is_kept_for_its_render_only_while_the_file_is_unchanged(tmp_path):
    import numpy as np

    from ditto_fast.audio.decode import DecodedAudio
    from ditto_fast.serve.decoded import DecodedMemo

    memo = DecodedMemo(limit=5 * 16000 * 4)          # five seconds of samples
    paths = [tmp_path / f"{i}.wav" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(b"x" * (i + 1))
        memo.put(path, DecodedAudio(np.zeros(16000 * (i + 1), np.float32), f"{i}"))
    assert memo.take(paths[0]) is None                # the oldest dropped: 1 + 2 + 3 s are over the limit
    assert memo.take(paths[1]).sha256 == "1" and memo.take(paths[2]).sha256 == "2"
    paths[2].write_bytes(b"yyy!")                     # replaced since its check: decoded again
    assert memo.take(paths[2]) is None
    paths[1].unlink()
    assert memo.take(paths[1]) is None


# ----------------------------------------------------------------------------- the API, in process
def test_the_api_queues_a_checked_job_and_refuses_as_render_does(api, clips, tmp_path, run_cli, session_home,
                                                                  tiny_checkpoints):
    client, queue, events = api
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4"),
                                      "priority": "breaking"})
    assert r.status_code == 202 and r.json()["status"] == "queued", r.text
    job = client.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["priority"] == 100 and job["request"]["audio"] == str(audio) and job["progress"] is None
    # refused with render's own line and exit code, before anything is queued
    bad = {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "g.mp4"), "emotion": "grumpy"}
    r = client.post("/v1/jobs", json=bad)
    cli = run_cli(["render", "--avatar", "anchor", "--audio", audio, "-o", tmp_path / "g.mp4", "--emotion", "grumpy",
                   "--device", "cpu"], store_env(session_home, tiny_checkpoints))
    assert r.status_code == 400 and r.json() == {"error": cli.stderr.strip().split("error: ", 1)[1],
                                                 "exit_code": cli.returncode}
    for body, said in (({"avatar": "anchor", "audio": "/etc/passwd", "output": str(tmp_path / "p.mp4")}, "outside"),
                       ({"avatar": "anchor", "audio": str(audio), "output": "../../x.mp4"}, "outside"),
                       ({"avatar": "anchor", "audio": str(audio), "output": str(audio)}, "overwrite an input"),
                       ({"avatar": "nobody", "audio": str(audio), "output": str(tmp_path / "n.mp4")}, "nobody"),
                       ({"avatar": "anchor", "audio": str(audio)}, "output"),
                       ({"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "c.mp4"),
                         "callback": "file:///etc/passwd"}, "callback")):
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 400 and said in r.json()["error"] and r.json()["exit_code"] in (2, 3, 5), r.text
    assert client.post("/v1/jobs", json=[1]).status_code == 400
    assert client.post("/v1/jobs", content=b"{" + b" " * (100 << 10) + b"}",
                       headers={"Content-Type": "application/json"}).status_code == 413
    assert queue.counts()["queued"] == 1
    # cancel while queued: it never runs
    r = client.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and queue.take() is None
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 409
    assert client.get("/v1/jobs/nope").status_code == 404
    assert [j["status"] for j in client.get("/v1/jobs", params={"status": "cancelled"}).json()["jobs"]] == ["cancelled"]
    assert any(e.get("state") == "cancelled" for e in events)


def test_the_api_needs_its_token_and_describes_itself(api):
    client, queue, _ = api
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401
    # health: without the token only up or down; with it, each engine's state (the dispatch thread not started
    # here: no engine dispatches, so it is down)
    anonymous = client.get("/healthz", headers={"Authorization": ""})
    assert anonymous.status_code == 503 and anonymous.json() == {"ok": False}
    (engine,) = client.get("/healthz").json()["engines"]
    assert engine["state"] == "idle" and engine["dispatching"] is False and engine["restarts"] == 0
    metrics = client.get("/metrics").text
    assert 'ditto_fast_jobs{state="queued"} 0.0' in metrics and "ditto_fast_turnaround_seconds_bucket" in metrics
    schema = client.get("/openapi.json").json()["components"]["schemas"]["Job"]["properties"]
    assert {"avatar", "audio", "output", "emotion", "delivery", "priority", "callback"} <= set(schema)


# ----------------------------------------------------------------------------- the watch folder, in process
def test_the_watch_folder_takes_settled_files_with_their_sidecars(engine, session_home, clips, tmp_path):
    from ditto_fast.serve.jobs.accept import Acceptor
    from ditto_fast.serve.jobs.watch import WatchFolder

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    out.mkdir()
    queue = JobQueue(tmp_path / "q.sqlite")
    watch = WatchFolder(inbox, out, {"avatar": "anchor", "steps": 2}, Acceptor(queue, engine.setup, [inbox, out]),
                        queue, lambda: None, lambda e: None, settle_s=5)
    growing = inbox / "news.wav"
    data = clips[1].read_bytes()
    growing.write_bytes(data[:1000])
    watch.poll(now=0)
    with open(growing, "ab") as f:
        f.write(data[1000:])
    watch.poll(now=4)                    # grew since: the clock starts again
    watch.poll(now=8)
    assert queue.counts()["queued"] == 0
    (inbox / "bad.json").write_text('{"emotion": "grumpy"}')
    shutil.copy(clips[0], inbox / "bad.wav")
    watch.poll(now=9)
    watch.poll(now=14)
    job, = queue.list("queued")
    assert job["request"]["steps"] == 2 and job["output"] == str(out / "news.mp4") and job["watch_path"] == str(growing)
    assert sorted(p.name for p in (inbox / "failed").iterdir()) == ["bad.error.txt", "bad.json", "bad.wav"]
    assert (inbox / "failed" / "bad.error.txt").read_text() == (
        "unknown emotion 'grumpy'; use one of angry, disgust, fear, happy, neutral, sad, surprise, contempt, "
        "auto (read from the speech) or a mix like happy+surprise\nexit code 2\n")
    watch.poll(now=30)
    assert queue.counts()["queued"] == 1           # queued already: not taken twice
    queue.take()
    queue.finish(job["id"], "done", output=job["output"])
    watch.poll(now=31)
    assert (inbox / "done" / "news.wav").is_file() and not growing.exists()


# ----------------------------------------------------------------------------- a real server
@pytest.mark.slow
def test_a_served_job_is_the_file_render_writes(serving, tmp_path, run_cli, tiny_checkpoints):
    server = serving()
    audio = speech_clip(tmp_path, "a.wav", 0.8)
    status, body = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio),
                                                   "output": str(tmp_path / "served.mp4"), "emotion": "happy"})
    assert status == 202, body
    job = server.wait(body["id"])
    assert job["status"] == "done" and job["exit_code"] == 0 and job["timings"]["frames"] == 20, job
    r = run_cli(["render", "--avatar", "anchor", "--audio", audio, "-o", tmp_path / "rendered.mp4", "--emotion",
                 "happy", "--device", "cpu", "--quiet"], store_env(tmp_path / "home", tiny_checkpoints))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "served.mp4").read_bytes() == (tmp_path / "rendered.mp4").read_bytes()
    # the same request again: done at once, from the digest in the output
    again = server.wait(server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio),
                                                         "output": str(tmp_path / "served.mp4"),
                                                         "emotion": "happy"})[1]["id"])
    assert again["status"] == "done" and again["skipped"] and again["timings"] is None
    assert server.stop() == 0
    lines = [json.loads(line) for line in server.log.read_text().splitlines()]
    assert [e["state"] for e in lines if e.get("job") == body["id"]] == ["queued", "running", "done"]


@pytest.mark.slow
def test_a_killed_server_loses_no_job_and_leaves_nothing_half_written(serving, tmp_path):
    server = serving()
    out = tmp_path / "out"
    out.mkdir()
    audio = speech_clip(tmp_path, "long.wav", 4.0)
    ids = [server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "output": str(out / f"{i}.mp4"),
                                            "seed": i})[1]["id"] for i in range(3)]
    server.wait(ids[0], states=("running",))
    deadline = time.monotonic() + 120
    while (server.call("GET", f"/v1/jobs/{ids[0]}")[1]["progress"] or {}).get("stage") != "frames":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    server.stop(signal.SIGKILL)                                  # in the middle of the first job's frames
    assert not any(p.suffix == ".mp4" and not p.name.startswith(".") for p in out.iterdir())
    again = serving()
    jobs = [again.wait(i) for i in ids]
    assert [j["status"] for j in jobs] == ["done"] * 3 and jobs[0]["attempts"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["0.mp4", "1.mp4", "2.mp4"]


@pytest.mark.slow
def test_breaking_news_runs_next_and_a_running_job_can_be_cancelled(serving, tmp_path):
    server = serving()
    audio = speech_clip(tmp_path, "n.wav", 2.0)
    normal = [server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio),
                                               "output": str(tmp_path / f"n{i}.mp4"), "seed": i})[1]["id"]
              for i in range(4)]
    server.wait(normal[0], states=("running",))
    breaking = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "priority": "breaking",
                                                "output": str(tmp_path / "breaking.mp4")})[1]["id"]
    b = server.wait(breaking)
    others = [server.call("GET", f"/v1/jobs/{i}")[1] for i in normal]
    assert b["status"] == "done"
    assert all(o["started"] is None or o["started"] >= b["started"] for o in others[1:]), (b, others)
    assert b["started"] >= others[0]["finished"] - 0.5            # it waited for the running job only
    victim = normal[-1]
    server.wait(victim, states=("running",))
    status, body = server.call("DELETE", f"/v1/jobs/{victim}")
    assert status == 202, body
    assert server.wait(victim)["status"] == "cancelled"
    assert not (tmp_path / "n3.mp4").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".n3.mp4")]


@pytest.mark.slow
def test_a_finished_job_is_posted_to_its_callback_and_the_watch_folder_files_inputs(serving, tmp_path, clips):
    hook = Receiver()
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    server = serving("--watch", str(inbox), "--out", str(out), "--avatar", "anchor", "--settle", "1", "--poll", "0.3",
                     "--callback-allow", "127.0.0.1")
    audio = shutil.copy(clips[0], tmp_path / "cb.wav")           # a path under the server's roots
    job = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "output": str(out / "cb.mp4"),
                                           "callback": hook.url("/done")})[1]
    assert server.wait(job["id"])["status"] == "done"
    shutil.copy(clips[1], inbox / "story.wav")
    deadline = time.monotonic() + 120
    while not (inbox / "done" / "story.wav").exists():
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.2)
    assert (out / "story.mp4").is_file()
    shutil.copy(clips[1], inbox / "story.wav")                  # dropped twice: rendered once
    while not (inbox / "done" / "story-1.wav").exists():
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.2)
    watched = [j for j in server.call("GET", "/v1/jobs")[1]["jobs"] if j["source"] == "watch"]
    assert sorted(j["skipped"] for j in watched) == [False, True]
    received = hook.bodies()
    assert received[0]["id"] == job["id"] and received[0]["status"] == "done"
    hook.close()


@pytest.mark.slow
def test_a_second_server_on_the_same_home_is_refused_naming_the_first(serving, tmp_path):
    first = serving()
    r = subprocess.run([*first.args[:first.args.index("--port") + 1], str(free_port()), "--root", str(tmp_path)],
                       env=first.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and f"pid {first.proc.pid}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert first.call("GET", "/healthz")[0] == 200


@pytest.mark.slow
def test_a_job_its_server_keeps_dying_on_is_failed_and_its_callback_sent_after_the_restart(serving, tmp_path):
    hook = Receiver()
    allow = ("--callback-allow", "127.0.0.1")
    server = serving(*allow)
    audio = speech_clip(tmp_path, "long.wav", 4.0)
    job_id = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "x.mp4"),
                                              "callback": hook.url()})[1]["id"]
    for _ in range(2):                          # as under systemd's Restart=always, a job that kills its server
        wait_for_frames(server, job_id)
        server.stop(signal.SIGKILL)
        server = serving(*allow)
    job = server.wait(job_id)
    assert job["status"] == "failed" and job["crashes"] == 2 and job["attempts"] == 2, job
    assert job["error"].startswith("killed its engine 2 times (server died, server died)")
    assert [(b["id"], b["status"]) for b in hook.bodies()] == [(job_id, "failed")]
    assert not (tmp_path / "x.mp4").exists()
    hook.close()


def test_serve_refuses_to_listen_beyond_this_machine_without_a_token(tmp_path, run_cli):
    r = run_cli(["serve", "--host", "0.0.0.0", "--port", str(free_port())])
    assert r.returncode == 2 and "--token-file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    short = tmp_path / "token"
    short.write_text("abc\n")
    r = run_cli(["serve", "--host", "0.0.0.0", "--token-file", str(short), "--port", str(free_port())])
    assert r.returncode == 2 and "at least 16" in r.stderr
    r = run_cli(["serve", "--workers", "2", "--port", str(free_port())])
    assert r.returncode == 2 and "--workers goes with --ray" in r.stderr


@pytest.mark.slow
def test_serve_in_its_default_set_up_answers_no_other_site_nor_a_rebound_name(serving, tmp_path, clips):
    """Loopback, no token: a form POSTed from any web page, or a page whose name was rebound to 127.0.0.1, reads and
    stores nothing (an upload needs a header no form can send: the newsroom page sends it)."""
    import http.client

    server = serving("--allow-host", "news.example")

    def call(method: str, path: str, headers: dict, body: bytes | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        answer = r.status, json.loads(r.read() or b"null")
        conn.close()
        return answer

    own = f"127.0.0.1:{server.port}"
    form = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
            + clips[0].read_bytes() + b"\r\n--b--\r\n")
    multipart = {"Content-Type": "multipart/form-data; boundary=b"}
    status, body = call("GET", "/v1/settings", {"Host": f"evil.example:{server.port}"})
    assert status == 421 and set(body) == {"error", "exit_code"} and "--allow-host" in body["error"], body
    assert call("GET", "/v1/settings", {"Host": f"news.example:{server.port}"})[0] == 200
    status, body = call("POST", "/v1/uploads", {"Host": own, "Origin": "http://evil.example", **multipart}, form)
    assert status == 403 and body["exit_code"] == 2, body
    status, body = call("POST", "/v1/uploads", {"Host": own, **multipart}, form)          # what a form sends
    assert status == 403 and "X-Requested-With" in body["error"], body
    assert not (tmp_path / "uploads").exists() or not list((tmp_path / "uploads").iterdir())
    status, body = call("POST", "/v1/uploads", {"Host": own, "Origin": f"http://{own}", "X-Requested-With": "x",
                                                **multipart}, form)
    assert status == 201, body
    assert server.stop() == 0


@pytest.mark.slow
def test_listening_is_logged_once_the_port_is_bound_and_never_when_it_cannot_be(serving, tmp_path, video_avatar,
                                                                             session_home, tiny_checkpoints):
    server = serving()                                  # started: its health answered
    events = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    assert [e["url"] for e in events if e.get("event") == "listening"] == [f"http://127.0.0.1:{server.port}"]
    assert server.stop() == 0
    # the port taken after serve looked at it (while its engine loads): no "listening", one line, exit 2
    late = Server(store_env(tmp_path / "home", tiny_checkpoints), tmp_path)
    late.proc = subprocess.Popen(late.args, env=late.env, stdout=subprocess.DEVNULL, stderr=open(late.log, "wb"),
                                 start_new_session=True)
    deadline, lock = time.monotonic() + 60, tmp_path / "home" / "serve" / "server.lock"
    while not (lock.exists() and lock.read_text().strip() == str(late.proc.pid)):     # past its look at the port
        assert time.monotonic() < deadline and late.proc.poll() is None, late.log.read_text()
        time.sleep(0.05)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", late.port))
        taken.listen()
        assert late.proc.wait(120) == 2, late.log.read_text()
    text = late.log.read_text()
    assert '"listening"' not in text, text
    assert f"ditto-fast: error: cannot listen on 127.0.0.1:{late.port}" in text, text


@pytest.mark.slow
def test_sigterm_mid_render_stops_cleanly_and_the_job_runs_at_the_next_start(serving, tmp_path):
    server = serving()
    audio = speech_clip(tmp_path, "long.wav", 4.0)
    job_id = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio),
                                              "output": str(tmp_path / "t.mp4")})[1]["id"]
    wait_for_frames(server, job_id)
    assert server.stop(signal.SIGTERM) == 0                      # stops at the next frame batch
    with sqlite3.connect(tmp_path / "home" / "serve" / "jobs.sqlite") as db:        # read only: no server of its own
        assert db.execute("SELECT status FROM jobs WHERE id=?", (job_id,)).fetchone() == ("queued",)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".t.mp4", "t.mp4"))]
    again = serving().wait(job_id)
    assert again["status"] == "done" and again["attempts"] == 2 and (tmp_path / "t.mp4").is_file(), again
