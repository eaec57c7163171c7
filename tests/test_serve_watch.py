"""ditto-fast serve's watch folder, in process (its `poll()` driven by hand): a file is known by its signature, so a
corrected file dropped under the same name is a new job and a file still being copied is never rendered or filed
as the one taken; two files never write one output; the watch thread outlives a bad file and a locked queue."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from ditto_fast.core.errors import InputError  # noqa: E402
from ditto_fast.engine.request import RenderRequest  # noqa: E402

SETTLE = 5.0


@pytest.fixture()
def folder(serve_parts, tmp_path):
    """A watch folder `in/` -> `out/` over `serve_parts` (avatar anchor, 2 steps), settling after 5 s."""
    from ditto_fast.serve.jobs.watch import WatchFolder

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    out.mkdir()
    parts = serve_parts
    watch = WatchFolder(inbox, out, {"avatar": "anchor", "steps": 2}, parts.acceptor, parts.queue,
                        parts.dispatcher.notify, parts.events.append, settle_s=SETTLE, poll_s=0.02)
    parts.watch, parts.inbox, parts.out = watch, inbox, out
    return parts


def _settle(watch, t: float) -> float:
    """Two looks at the folder a settling interval apart (files unchanged between them are taken); the time after."""
    watch.poll(now=t)
    watch.poll(now=t + SETTLE)
    return t + SETTLE + 1


def _drop(src: Path, dest: Path) -> Path:
    """Copy elsewhere, then rename in (a new file, a new inode), as the README asks."""
    tmp = dest.parent.parent / f".{dest.name}.part"
    shutil.copy(src, tmp)
    os.replace(tmp, dest)
    return dest


def _end(queue, job: dict, status: str = "done", **fields) -> None:
    """A job run to its end as a render thread would end it."""
    taken = queue.take()
    assert taken["id"] == job["id"]
    queue.finish(job["id"], status, output=job["output"], **fields)


def test_a_corrected_file_dropped_while_the_first_renders_is_a_new_job(folder, clips):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    news = _drop(clips[0], inbox / "news.wav")
    t = _settle(watch, 0)
    first, = queue.list("queued")
    queue.take()                                            # rendering
    _drop(clips[1], news)                                   # the corrected take, same name
    t = _settle(watch, t)
    second, = queue.list("queued")
    assert second["id"] != first["id"] and second["output"] == first["output"]
    queue.finish(first["id"], "done", output=first["output"])
    watch.poll(now=t)                                       # the first is filed: not the corrected file
    assert news.read_bytes() == clips[1].read_bytes() and not (inbox / "done").exists()
    _end(queue, second)
    watch.poll(now=t + 1)
    assert (inbox / "done" / "news.wav").read_bytes() == clips[1].read_bytes() and not news.exists()


def test_two_files_never_render_to_one_output(folder, clips):
    import soundfile as sf

    queue, watch, inbox, out = folder.queue, folder.watch, folder.inbox, folder.out
    audio, sr = sf.read(clips[1])
    sf.write(inbox / "clash.flac", audio, sr)
    _drop(clips[0], inbox / "clash.wav")
    t = _settle(watch, 0)
    job, = queue.list("queued")                             # the first in name order: clash.flac
    assert job["watch_path"] == str(inbox / "clash.flac") and job["output"] == str(out / "clash.mp4")
    note = (inbox / "failed" / "clash.error.txt").read_text()
    assert "clash.flac" in note and "rename" in note and note.endswith("exit code 2\n")
    assert (inbox / "failed" / "clash.wav").is_file()
    _end(queue, job)
    (out / "clash.mp4").write_bytes(b"clash.flac's render")
    watch.poll(now=t)
    _drop(clips[0], inbox / "clash.wav")                   # later: the output is clash.flac's
    _settle(watch, t + 1)
    assert queue.counts()["queued"] == 0
    assert "clash.flac" in (inbox / "failed" / "clash-1.error.txt").read_text()
    assert (out / "clash.mp4").read_bytes() == b"clash.flac's render"


def test_a_file_whose_copy_stalled_past_the_settle_time_is_not_rendered_truncated(folder, clips):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    data = clips[1].read_bytes()
    news = inbox / "news.wav"
    news.write_bytes(data)                                  # the copy stalls here, longer than --settle
    t = _settle(watch, 0)
    job = queue.take()
    with open(news, "ab") as f:                             # ... and goes on before the job starts
        f.write(b"\0" * 3200)
    request = RenderRequest.from_json(job["request"], Path("/"), "job")
    with pytest.raises(InputError, match="changed after the watch folder took it"):
        folder.acceptor.at_start(job, request)
    queue.finish(job["id"], "failed", error="changed", exit_code=3)
    watch.poll(now=t)                                       # not filed: it is not the file the job took
    assert news.is_file() and not (inbox / "failed").exists() and not (inbox / "done").exists()
    _settle(watch, t + 1)                                   # taken again, whole
    again, = queue.list("queued")
    assert again["watch_path"] == str(news) and again["id"] != job["id"]
    request = RenderRequest.from_json(again["request"], Path("/"), "job")
    folder.acceptor.at_start(queue.take(), request)         # unchanged since: starts


def test_a_file_removed_before_its_render_fails_the_job_and_files_nothing(folder, clips):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    news = _drop(clips[0], inbox / "news.wav")
    t = _settle(watch, 0)
    job = queue.take()
    news.unlink()
    with pytest.raises(InputError, match="removed"):
        folder.acceptor.at_start(job, RenderRequest.from_json(job["request"], Path("/"), "job"))
    queue.finish(job["id"], "failed", error="removed", exit_code=3)
    watch.poll(now=t)
    assert list(inbox.iterdir()) == [] and queue.get(job["id"])["moved"] == 1


def test_a_sidecar_that_arrives_after_its_audio_was_taken_stays_in_the_folder(folder, clips):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    _drop(clips[0], inbox / "news.wav")
    t = _settle(watch, 0)
    job, = queue.list("queued")
    (inbox / "news.json").write_text('{"emotion": "happy"}')        # too late for this job
    _end(queue, job)
    watch.poll(now=t)
    assert (inbox / "done" / "news.wav").is_file() and not (inbox / "done" / "news.json").exists()
    assert (inbox / "news.json").is_file()
    # one read with its audio goes with it
    _drop(clips[1], inbox / "weather.wav")
    (inbox / "weather.json").write_text('{"emotion": "sad"}')
    t = _settle(watch, t + 1)
    job = next(j for j in queue.list("queued") if j["watch_path"].endswith("weather.wav"))
    assert job["request"]["emotion"] == "sad"
    _end(queue, job)
    watch.poll(now=t)
    assert (inbox / "done" / "weather.json").is_file()


def test_a_delivery_profile_outside_the_roots_is_never_read_into_a_note(folder, clips, tmp_path_factory):
    inbox = folder.inbox
    secret = tmp_path_factory.mktemp("outside") / "station.yaml"
    secret.write_text("SECRET-CONTENT-123: [\n")
    _drop(clips[0], inbox / "news.wav")
    (inbox / "news.json").write_text(json.dumps({"delivery": str(secret)}))
    _settle(folder.watch, 0)
    note = (inbox / "failed" / "news.error.txt").read_text()
    assert "outside the folders" in note and "SECRET" not in note and "SECRET" not in str(folder.events)


def test_a_bad_file_name_or_sidecar_fails_that_file_only(folder, clips, monkeypatch):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    latin1 = inbox / os.fsdecode(b"M\xe4rz.wav")            # a Latin-1 name from an SMB share
    _drop(clips[0], latin1)
    _drop(clips[0], inbox / "nul.wav")
    (inbox / "nul.json").write_text(json.dumps({"output": str(folder.out / "a\0b.mp4")}))
    _drop(clips[1], inbox / "good.wav")
    _drop(clips[2], inbox / "bug.wav")
    accept = folder.acceptor.accept

    def buggy(data, where, **kw):
        if where.endswith("bug.wav"):
            raise RuntimeError("a bug in one file's check")
        return accept(data, where, **kw)

    monkeypatch.setattr(folder.acceptor, "accept", buggy)
    _settle(watch, 0)
    job, = queue.list("queued")
    assert job["watch_path"] == str(inbox / "good.wav")
    failed = inbox / "failed"
    note = (failed / f"{latin1.stem}.error.txt").read_text()
    assert "M\\xe4rz.wav" in note and "not valid UTF-8" in note and (failed / latin1.name).is_file()
    assert "NUL" in (failed / "nul.error.txt").read_text() and (failed / "nul.json").is_file()
    assert "internal error" in (failed / "bug.error.txt").read_text()
    assert any(e.get("error") and "bug" in e["error"] for e in folder.events)


def test_the_watch_thread_survives_a_locked_queue_and_says_it_is_alive(folder, clips, monkeypatch):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    watched, locked = queue.watched, [3]

    def busy(*args, **kw):
        if locked[0]:
            locked[0] -= 1
            raise sqlite3.OperationalError("database is locked")
        return watched(*args, **kw)

    monkeypatch.setattr(queue, "watched", busy)
    watch.settle_s = 0.1
    assert watch.last_poll is None and not watch.alive
    watch.start()
    try:
        _drop(clips[0], inbox / "news.wav")
        deadline = time.monotonic() + 30
        while not queue.list("queued"):
            assert time.monotonic() < deadline and watch.alive, folder.events
            time.sleep(0.05)
        assert watch.alive and time.time() - watch.last_poll < 10
    finally:
        watch.stop()
    assert not watch.alive
    errors = [e for e in folder.events if e.get("error")]
    assert len(errors) == 3 and all("database is locked" in e["error"] for e in errors)


def test_the_held_files_fail_alone(folder, clips, tmp_path):
    """What the probes found held: a zero-byte, a sparse 4 GB and a fake .wav fail with exit 3; a file written
    elsewhere and renamed in is taken."""
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    (inbox / "empty.wav").write_bytes(b"")
    with open(inbox / "sparse.wav", "wb") as f:
        f.truncate(4 << 30)
    (inbox / "fake.wav").write_text("this is not audio\n" * 100)
    _drop(clips[0], inbox / "renamed.wav")
    _settle(watch, 0)
    assert [j["watch_path"] for j in queue.list("queued")] == [str(inbox / "renamed.wav")]
    for name in ("empty", "sparse", "fake"):
        assert (inbox / "failed" / f"{name}.error.txt").read_text().endswith("exit code 3\n"), name


def test_serve_refuses_a_watch_folder_without_an_avatar(tmp_path, run_cli):
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    r = run_cli(["serve", "--watch", str(inbox), "--out", str(out), "--port", "1"])
    assert r.returncode == 2 and "--avatar" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_captions_or_a_script_beside_a_dropped_file_go_with_its_job(folder, clips):
    queue, watch, inbox = folder.queue, folder.watch, folder.inbox
    (inbox / "news.srt").write_text("1\n00:00:00,250 --> 00:00:00,350\nHi\n")     # 608 loads it in time
    (inbox / "weather.txt").write_text("Sun.\n")                 # what 608 can show in its 0.6 s
    _drop(clips[0], inbox / "news.wav")
    _drop(clips[1], inbox / "weather.wav")
    t = _settle(watch, 0)
    jobs = {Path(j["watch_path"]).stem: j for j in queue.list("queued")}
    assert jobs["news"]["request"]["captions"] == str(inbox / "news.srt") and "script" not in jobs["news"]["request"]
    assert jobs["weather"]["request"]["script"] == str(inbox / "weather.txt")
    for _ in jobs:                                          # each run to its end, in the queue's order
        taken = queue.take()
        queue.finish(taken["id"], "done", output=taken["output"])
    watch.poll(now=t)
    assert {p.name for p in (inbox / "done").iterdir()} == {"news.wav", "news.srt", "weather.wav", "weather.txt"}
    # timed text that is malformed fails its file alone, with the line named
    (inbox / "late.srt").write_text("1\n00:00:00,100 --> 00:00:09,000\nToo long\n")
    _drop(clips[2], inbox / "late.wav")
    _settle(watch, t + 1)
    assert "past the audio's end" in (inbox / "failed" / "late.error.txt").read_text()
    assert (inbox / "failed" / "late.srt").is_file()
