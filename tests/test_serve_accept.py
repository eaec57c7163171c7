"""ditto-fast serve, accepting a job: the roots checked when a job is accepted and again when it starts, nothing
read outside them (a delivery profile's content never echoed), an existing output kept unless the job says
"overwrite", and paths no file can have refused as `render` refuses them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from ditto_fast.core.errors import UsageError  # noqa: E402
from ditto_fast.engine.request import RenderRequest  # noqa: E402

SECRET = "SECRET-CONTENT-123"


def _started(parts) -> tuple[dict, RenderRequest]:
    """The next queued job as a render thread takes it, and its request."""
    job = parts.queue.take()
    return job, RenderRequest.from_json(job["request"], Path("/"), f"job {job['id']}")


def _secret_profile(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "station.yaml"
    path.write_text(f"{SECRET}: [\n")                # not even valid YAML: its parser would quote it
    return path


def test_a_folder_swapped_for_a_link_after_accept_is_refused_when_the_job_starts(serve_parts, clips, tmp_path,
                                                                                  tmp_path_factory):
    parts = serve_parts
    outside = tmp_path_factory.mktemp("outside")
    sub = tmp_path / "sub"
    sub.mkdir()
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    parts.acceptor.accept({"avatar": "anchor", "audio": str(audio), "output": str(sub / "a.mp4")}, "request")
    sub.rmdir()
    sub.symlink_to(outside, target_is_directory=True)          # after the job was accepted
    job, request = _started(parts)
    with pytest.raises(UsageError, match="outside the folders this server may use"):
        parts.acceptor.at_start(job, request)
    # the render thread calls it: the job fails and nothing is written outside the roots
    parts.queue.requeue(job["id"])
    parts.dispatcher.start()
    try:
        ended = _wait_final(parts.queue, job["id"])
    finally:
        parts.dispatcher.stop()
    assert ended["status"] == "failed" and "outside" in ended["error"] and ended["exit_code"] == 2, ended
    assert list(outside.iterdir()) == []


def test_an_input_swapped_for_a_link_after_accept_is_refused_when_the_job_starts(serve_parts, clips, tmp_path,
                                                                                  tmp_path_factory):
    parts = serve_parts
    outside = Path(shutil.copy(clips[1], tmp_path_factory.mktemp("outside") / "private.wav"))
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    parts.acceptor.accept({"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4")}, "request")
    audio.unlink()
    audio.symlink_to(outside)
    job, request = _started(parts)
    with pytest.raises(UsageError, match="the input is outside"):
        parts.acceptor.at_start(job, request)


def _wait_final(queue, job_id: str, timeout: float = 60) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while (job := queue.get(job_id))["status"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


def test_a_delivery_profile_outside_the_roots_is_refused_before_it_is_read(api, clips, tmp_path,
                                                                            tmp_path_factory):
    client, queue, events = api
    secret = _secret_profile(tmp_path_factory.mktemp("outside"))
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    for delivery in (str(secret), f"../{secret.parent.name}/station.yaml"):
        r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mxf"),
                                          "delivery": delivery})
        assert r.status_code == 400 and "outside the folders" in r.json()["error"], r.text
        assert SECRET not in r.text
    inside = _secret_profile(tmp_path / "profiles")           # under the roots: read, and its problem named
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mxf"),
                                      "delivery": str(inside)})
    assert r.status_code == 400 and str(inside) in r.json()["error"]
    assert queue.counts()["queued"] == 0 and SECRET not in str(events)
    r = client.post("/v1/jobs", json={"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mxf"),
                                      "delivery": "xdcam-hd422-1080i50"})        # a shipped profile: not a root's
    assert r.status_code == 202, r.text


def test_an_existing_output_is_replaced_only_when_the_job_says_overwrite(api, serve_parts, clips, tmp_path):
    client, queue, _ = api
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    theirs = tmp_path / "promo.mov"
    theirs.write_bytes(b"someone else's finished promo")
    job = {"avatar": "anchor", "audio": str(audio), "output": str(theirs)}
    r = client.post("/v1/jobs", json=job)
    assert r.status_code == 400 and r.json()["exit_code"] == 2, r.text
    assert "exists" in r.json()["error"] and '"overwrite": true' in r.json()["error"]
    for bad in ("yes", 1, "true"):
        r = client.post("/v1/jobs", json={**job, "overwrite": bad})
        assert r.status_code == 400 and "overwrite must be true or false" in r.json()["error"], r.text
    r = client.post("/v1/jobs", json={**job, "overwrite": True})
    assert r.status_code == 202, r.text
    assert queue.get(r.json()["id"])["request"].get("overwrite") is None      # not a render setting
    assert theirs.read_bytes() == b"someone else's finished promo"             # nothing touched at accept


def test_the_same_request_again_is_not_an_overwrite(serve_parts, clips, tmp_path):
    """A request identical to a finished one (its output carries the same digest) is accepted and done at once."""
    parts = serve_parts
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    job = {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4"), "steps": 2}
    parts.acceptor.accept(job, "request")
    parts.dispatcher.start()
    try:
        first = _wait_final(parts.queue, parts.queue.list()[0]["id"], timeout=300)
        assert first["status"] == "done", first
        again = parts.acceptor.accept(job, "request")
        parts.dispatcher.notify()
        assert _wait_final(parts.queue, again["id"])["skipped"] == 1
        with pytest.raises(UsageError, match="exists"):
            parts.acceptor.accept({**job, "steps": 3}, "request")          # another render: not the same
    finally:
        parts.dispatcher.stop()


@pytest.mark.parametrize("key,suffix", [("output", ".mp4"), ("audio", ".wav"), ("controls", ".json"),
                                        ("emotion", ".json"), ("delivery", ".yaml")])
def test_paths_no_file_can_have_are_refused_by_the_api_and_render_alike(api, clips, tmp_path, run_cli,
                                                                        session_home, tiny_checkpoints, key, suffix):
    from conftest import store_env

    client, queue, _ = api
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    base = {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4")}
    for bad, said, code in ((str(tmp_path / f"a\0b{suffix}"), "NUL", 2),
                            (str(tmp_path / ("x" * 300 + suffix)), "more than the 255 the disk allows", 3),
                            (str(tmp_path) + "/d" * 2750 + suffix, "more than the 4095 the system allows", 3)):
        r = client.post("/v1/jobs", json={**base, key: bad})
        assert r.status_code == 400 and r.json()["exit_code"] == code and said in r.json()["error"], r.text
        if key == "output" and "\0" not in bad:          # a command line cannot carry a NUL
            cli = run_cli(["render", "--avatar", "anchor", "--audio", audio, "-o", bad, "--device", "cpu"],
                          store_env(session_home, tiny_checkpoints))
            assert cli.returncode == code and said in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    assert queue.counts()["queued"] == 0


def test_a_path_that_is_not_utf8_is_refused_and_a_stored_one_still_lists(api, clips, tmp_path):
    client, queue, _ = api
    latin1 = tmp_path / "M\udce4rz.wav"                  # the file name b"M\xe4rz.wav", Latin-1 on an SMB share
    shutil.copy(clips[0], latin1)
    body = json.dumps({"avatar": "anchor", "audio": str(latin1), "output": str(tmp_path / "m.mp4")})   # \udce4
    r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["error"] and "M\\xe4rz.wav" in r.json()["error"]
    # a row an older server stored: listing and looking it up still answer, the name shown byte by byte
    old = queue.submit({"avatar": "anchor", "audio": str(latin1), "output": str(tmp_path / "m.mp4")},
                       output=str(tmp_path / "m.mp4"))        # the request's JSON keeps it as "\\udce4"
    listed = client.get("/v1/jobs")
    assert listed.status_code == 200 and listed.json()["jobs"][0]["request"]["audio"] == str(tmp_path / "M\\xe4rz.wav")
    one = client.get(f"/v1/jobs/{old['id']}")
    assert one.status_code == 200 and one.json()["request"]["audio"].endswith("M\\xe4rz.wav")


def test_the_held_refusals_of_accept(api, clips, tmp_path, tmp_path_factory):
    """What the probes found held: names and links out of the roots, avatar names, values out of range."""
    client, queue, _ = api
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    outside = tmp_path_factory.mktemp("outside")
    (tmp_path / "out-link").symlink_to(outside, target_is_directory=True)
    (tmp_path / "secret.wav").symlink_to(shutil.copy(clips[1], outside / "s.wav"))
    base = {"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4")}
    for change, said, code in (({"output": str(tmp_path / "out-link" / "x.mp4")}, "outside", 2),
                               ({"audio": str(tmp_path / "secret.wav")}, "outside", 2),
                               ({"audio": "a.wav", "output": "../elsewhere.mp4"}, "outside", 2),
                               ({"avatar": "../anchor"}, "avatar", 2),
                               ({"avatar": "nobody"}, "nobody", 5),
                               ({"steps": 10 ** 9}, "steps", 2),
                               ({"seed": -1}, "seed", 2),
                               ({"fps": "1000"}, "rate", 2),
                               ({"steps": "many"}, "steps", 2),
                               ({"volume": 11}, "unknown key", 2)):
        r = client.post("/v1/jobs", json={**base, **change})
        assert r.status_code == 400 and said in r.json()["error"] and r.json()["exit_code"] == code, (change, r.text)
    assert queue.counts()["queued"] == 0
    assert not list(outside.glob("*.mp4"))


def test_a_corrupt_avatar_record_is_refused_at_accept(api, clips, tmp_path, video_avatar, monkeypatch):
    client, queue, _ = api
    home = tmp_path / "home"
    shutil.copytree(video_avatar, home / "avatars" / "broken")
    (home / "avatars" / "broken" / "avatar.pkl").write_bytes(b"\x80\x04not a pickle at all")
    monkeypatch.setenv("DITTO_FAST_HOME", str(home))
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    r = client.post("/v1/jobs", json={"avatar": "broken", "audio": str(audio), "output": str(tmp_path / "b.mp4")})
    assert r.status_code == 400 and r.json()["exit_code"] == 5 and "broken" in r.json()["error"], r.text
    assert queue.counts()["queued"] == 0


def test_text_that_is_not_utf8_is_refused_wherever_it_is(serve_parts, clips, tmp_path):
    parts = serve_parts
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    with pytest.raises(UsageError, match="callback .*not valid UTF-8"):
        parts.acceptor.check({"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4"),
                              "callback": "http://mam/\udce9"}, "request")
    assert parts.queue.counts()["queued"] == 0
