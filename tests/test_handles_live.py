"""Live sessions on the engine host: a session is work for an engine process as a render job is, on the networks it
has loaded, beside its renders, supervised alike (a hang found by the heartbeat and named in the session's cause);
and an engine process outlives the thread that asked for it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import imageio_ffmpeg
import pytest
import soundfile as sf

from ditto_fast.engine.clip import check_clip
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles.base import EngineJob, EngineLimits
from ditto_fast.handles.live_link import SessionOrder
from ditto_fast.handles.process import ProcessEngine
from ditto_fast.live.options import LiveRequest

pytestmark = pytest.mark.slow          # real engine processes

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()


def _frames(path: Path) -> int:
    """Frames of the video stream in `path` as ffmpeg decodes them (0 if none decode)."""
    res = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-i", str(path), "-map", "0:v", "-f", "null", "-"],
                         capture_output=True, text=True)
    counts = [ln.split("frame=")[1].split()[0] for ln in res.stderr.replace("\r", "\n").splitlines() if "frame=" in ln]
    return int(counts[-1]) if counts else 0


def _until(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def engines(engine):
    made: list[ProcessEngine] = []

    def make(**limits) -> ProcessEngine:
        made.append(ProcessEngine(engine.setup, name=f"engine-{len(made)}", limits=EngineLimits(**limits)))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_an_engine_started_from_a_thread_that_ends_lives_on(engines, engine, clips, tmp_path):
    """The thread that asks for an engine (an HTTP server's worker, retired when idle) may end: the engine stays."""
    handle = engines()
    starter = threading.Thread(target=handle.start)
    starter.start()
    starter.join()
    pid = handle.pid
    time.sleep(1.5)                                     # Linux's parent-death signal would have fired by now
    assert handle.pid == pid and handle.state().state == "idle", handle.state()
    request = RenderRequest(avatar="anchor", audio=clips[0], output=tmp_path / "a.mp4")
    audio = check_clip(request, engine.avatar("anchor"), engine.config).audio
    result = handle.render(EngineJob(request, audio))
    assert (tmp_path / "a.mp4").is_file() and handle.pid == pid
    # the networks' load is said when the engine is ready, not charged to its first job (serve's first job after
    # "listening" showed load_models 6.9 s)
    assert handle.info["load_seconds"] > 0 and result.timings["stages"]["load_models"] == 0, result.timings


def test_a_session_streams_on_the_engine_beside_its_renders(engines, engine, clips, speech_wav, tmp_path):
    handle = engines()
    handle.start()
    heard: list = []
    out = tmp_path / "live.ts"
    link = handle.open_live(SessionOrder(LiveRequest(avatar="anchor", out=str(out), max_latency=3.0), label="s1"),
                            heard=lambda event, detail: heard.append(event))
    _until(lambda: link.state == "streaming", f"the session started: {link.state} {link.error}")
    assert handle.state().sessions == ["s1"] and link.engine == handle.name
    speech, rate = sf.read(speech_wav, dtype="float32", frames=16000 * 2)
    assert rate == 16000
    for i in range(0, len(speech), 3200):                # 0.2 s at a time, a little ahead of the clock
        link.push(speech[i:i + 3200])
        time.sleep(0.15)
    # a render beside the session: the same bytes as in this process
    ref = engine.render(RenderRequest(avatar="anchor", audio=clips[0], output=tmp_path / "ref.mp4"))
    request = RenderRequest(avatar="anchor", audio=clips[0], output=tmp_path / "beside.mp4")
    handle.render(EngineJob(request, check_clip(request, engine.avatar("anchor"), engine.config).audio))
    assert (tmp_path / "beside.mp4").read_bytes() == ref.output.read_bytes()
    _until(lambda: link.stats and link.taken >= len(speech), "the speech was taken")
    link.stop()
    assert link.wait(60) and link.state == "ended", link.error
    assert heard.count("ready") == 1 and heard[-1] == "ended"
    assert link.stats["frames"]["sent"] > 25 and handle.state().sessions == []
    assert _frames(out) == link.stats["frames"]["sent"]
    assert handle.state().state == "idle"


def test_a_hung_engine_ends_its_session_naming_the_hang_and_a_fresh_one_streams(engines, tmp_path):
    handle = engines(beat_s=3.0)
    handle.start()
    out = tmp_path / "hung.ts"
    link = handle.open_live(SessionOrder(LiveRequest(avatar="anchor", out=str(out))))
    _until(lambda: link.stats and link.stats["frames"]["sent"] > 10, "frames went out")
    pid = handle.pid
    os.kill(pid, signal.SIGSTOP)                        # no heartbeat: a hang in native code
    t0 = time.monotonic()
    assert link.wait(30), "the hang was not found"
    assert time.monotonic() - t0 < 3.0 + 5.0
    assert link.state == "failed" and "hung" in link.error and "heartbeat" in link.error, link.error
    state = handle.state()
    assert state.state == "dead" and "hung" in state.last_death and state.sessions == []
    _until(lambda: not Path(f"/proc/{pid}").exists(), "the hung engine was killed", 15)
    assert _frames(out) > 0                             # what it streamed stays playable
    again = handle.open_live(SessionOrder(LiveRequest(avatar="anchor", out=str(tmp_path / "next.ts"))))
    _until(lambda: again.state == "streaming", f"a fresh engine took the next session: {again.error}")
    assert handle.pid != pid and handle.state().restarts == 1
    again.stop()
    assert again.wait(60) and again.state == "ended"


def test_a_session_the_engine_cannot_run_fails_with_its_line_and_the_engine_goes_on(engines):
    handle = engines()
    handle.start()
    link = handle.open_live(SessionOrder(LiveRequest(avatar="nobody", out="/tmp/never.ts")))
    assert link.wait(30) and link.state == "failed" and "nobody" in link.error, link.error
    assert handle.state().state == "idle" and handle.state().sessions == []

