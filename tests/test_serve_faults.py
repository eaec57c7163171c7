"""`serve` under faults, on a real server whose engine is a real child process: an engine killed, segfaulted or out of
memory under a job leaves the server answering, the job retried or failed by rule, and a fresh engine rendering
the next job; health says when no engine can render."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import time

import pytest

pytest.importorskip("fastapi")

from conftest import store_env  # noqa: E402
from support import Server, speech_clip, wait_for_frames  # noqa: E402

pytestmark = pytest.mark.slow


def _engine_pid(server: Server) -> int:
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    return int(re.fullmatch(r"pid (\d+)", engine["where"]).group(1))


def _submit(server: Server, audio, output) -> str:
    status, body = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "output": str(output)})
    assert status == 202, body
    return body["id"]


def _until(predicate, what: str, server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: " + server.log.read_text()[-3000:]
        time.sleep(0.2)


def _squeeze(pid: int) -> None:
    """Cap process `pid`'s address space just above what it holds now: its next large allocation fails."""
    with open(f"/proc/{pid}/status") as f:
        held = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.prlimit(pid, resource.RLIMIT_AS, (held + (8 << 20), held + (8 << 20)))


def test_an_engine_killed_segfaulted_or_out_of_memory_is_replaced_and_its_job_runs_again(serving, tmp_path):
    server = serving("--stall-timeout", "10")
    audio = speech_clip(tmp_path, "long.wav", 2.0)
    # a fresh engine capped, while idle, just above what it holds (its first render's allocations fail: an engine
    # that has rendered keeps its memory for the next clip, which then needs no more); then one killed and one
    # segfaulted during their frames
    faults = (("out of memory", _squeeze, False), ("SIGKILL", lambda pid: os.kill(pid, signal.SIGKILL), True),
              ("SIGSEGV", lambda pid: os.kill(pid, signal.SIGSEGV), True))
    for k, (word, fault, during) in enumerate(faults):
        if not during:
            fault(_engine_pid(server))
        job = _submit(server, audio, tmp_path / f"{k}.mp4")
        if during:
            wait_for_frames(server, job)
            fault(_engine_pid(server))
        done = server.wait(job)
        assert done["status"] == "done" and done["attempts"] == 2 and done["crashes"] == 1, (word, done)
        assert word in " ".join(done["crash_causes"]), done["crash_causes"]
        assert (tmp_path / f"{k}.mp4").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "a killed engine's leftovers"
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert engine["state"] == "idle" and engine["restarts"] == 3 and engine["dispatching"], engine
    metrics = server.call_text("/metrics")
    assert 'ditto_fast_engine_restarts_total{engine="engine-0"} 3.0' in metrics
    assert 'ditto_fast_job_crashes_total{outcome="queued"} 3.0' in metrics
    assert server.stop() == 0


def test_a_job_that_kills_its_engine_every_time_is_failed_and_the_next_job_renders(serving, tmp_path):
    server = serving("--max-crashes", "2")
    audio = speech_clip(tmp_path, "long.wav", 2.0)
    doomed = _submit(server, audio, tmp_path / "doomed.mp4")
    for attempt in (1, 2):
        _until(lambda: server.call("GET", f"/v1/jobs/{doomed}")[1]["attempts"] == attempt, "attempt", server)
        wait_for_frames(server, doomed)
        os.kill(_engine_pid(server), signal.SIGKILL)
    failed = server.wait(doomed)
    assert failed["status"] == "failed" and "killed its engine 2 times" in failed["error"], failed
    assert not (tmp_path / "doomed.mp4").exists()
    nxt = server.wait(_submit(server, speech_clip(tmp_path, "short.wav", 0.6), tmp_path / "next.mp4"))
    assert nxt["status"] == "done" and nxt["attempts"] == 1, (nxt["error"], server.log.read_text()[-3000:])
    assert server.stop() == 0


def test_health_is_down_while_no_engine_can_start_and_up_again_when_one_can(video_avatar, session_home,
                                                                          tiny_checkpoints, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints, ckpt)
    shutil.copytree(video_avatar, tmp_path / "home" / "avatars" / "anchor")
    server = Server(store_env(tmp_path / "home", ckpt), tmp_path).start()
    try:                                                # a first job: the server has the avatar open
        assert server.wait(_submit(server, speech_clip(tmp_path, "a.wav", 0.6), tmp_path / "a.mp4"))["status"] == "done"
        ckpt.rename(tmp_path / "ckpt-away")             # the next engine cannot load its networks
        os.kill(_engine_pid(server), signal.SIGKILL)
        _until(lambda: server.call("GET", "/healthz")[0] == 503, "health down", server)
        (engine,) = server.call("GET", "/healthz")[1]["engines"]
        assert engine["state"] == "dead" and "SIGKILL" in engine["last_death"], engine
        queued = _submit(server, speech_clip(tmp_path, "b.wav", 0.6), tmp_path / "b.mp4")   # still accepted
        (tmp_path / "ckpt-away").rename(ckpt)
        _until(lambda: server.call("GET", "/healthz")[0] == 200, "health up", server, timeout=90)
        assert server.wait(queued)["status"] == "done"
    finally:
        assert server.stop() == 0


def _encoders(engine: int) -> list[int]:
    """The ffmpeg processes engine process `engine` started."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().split(b"\0")[0]
        except (OSError, IndexError):
            continue
        if int(fields[1]) == engine and b"ffmpeg" in os.path.basename(command):
            found.append(int(entry))
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")     # dead, not yet reaped by init
    except OSError:
        return True


def test_a_server_killed_mid_render_takes_its_encoder_along_and_its_restart_clears_what_was_left(serving, tmp_path):
    server = serving()
    out = tmp_path / "out"
    out.mkdir()
    job = _submit(server, speech_clip(tmp_path, "long.wav", 4.0), out / "a.mp4")
    wait_for_frames(server, job)
    encoders = _encoders(_engine_pid(server))
    assert encoders, "the engine's encoder"
    for pid in encoders:            # an encoder still busy when its engine goes (a long flush, a slow disk)
        os.kill(pid, signal.SIGSTOP)
    try:
        server.stop(signal.SIGKILL)                     # the engine dies with its server; its encoder with it
        _until(lambda: all(_gone(pid) for pid in encoders), "the encoder gone", server, timeout=15)
        assert sorted(p.name[:8] for p in out.iterdir()) == [".a.mp4.c", ".a.mp4.p"], list(out.iterdir())
        again = serving("--max-crashes", "1")           # the job is failed at the restart: nothing renders there
        failed = again.wait(job)
        assert failed["status"] == "failed" and "server died" in failed["error"], failed
        assert list(out.iterdir()) == [], "the dead engine's partial file and claim"
        assert again.stop() == 0
    finally:
        for pid in encoders:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_job_past_job_timeout_fails_once_naming_it_and_the_next_job_renders(serving, tmp_path):
    server = serving("--job-timeout", "30")
    job = _submit(server, speech_clip(tmp_path, "long.wav", 2.0), tmp_path / "slow.mp4")
    wait_for_frames(server, job)
    os.kill(_engine_pid(server), signal.SIGSTOP)     # a render that goes on for ever (alive: no stall, no hang yet)
    slow = server.wait(job)
    assert slow["status"] == "failed" and slow["exit_code"] == 3, slow
    assert "--job-timeout (30 s)" in slow["error"] and "hung" not in slow["error"], slow["error"]
    assert slow["attempts"] == 1 and slow["crashes"] == 0 and slow["crash_causes"] == [], slow
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not re.search(r'ditto_fast_job_crashes_total\{[^}]*\} [1-9]', server.call_text("/metrics"))
    nxt = server.wait(_submit(server, speech_clip(tmp_path, "short.wav", 0.6), tmp_path / "next.mp4"))
    assert nxt["status"] == "done" and nxt["attempts"] == 1, nxt
    assert server.stop() == 0
