"""The engine in a child process: the same bytes as an engine in this process; a child that is killed, segfaults,
runs out of memory or hangs takes only itself (the job gets EngineDied, nothing is left at its output) and a fresh
engine renders the next job."""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

from ditto_fast.engine.clip import check_clip
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles.base import EngineDied, EngineError, EngineJob, JobCancelled
from ditto_fast.handles.base import EngineLimits
from ditto_fast.handles.process import ProcessEngine

pytestmark = pytest.mark.slow          # real engine processes


def _job(engine, audio: Path, output: Path, label: str = "") -> EngineJob:
    request = RenderRequest(avatar="anchor", audio=audio, output=output)
    clip = check_clip(request, engine.avatar("anchor"), engine.config)
    return EngineJob(request, clip.audio, label=label)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def child(engine):
    """A handle factory; every handle made is closed after the test."""
    made: list[ProcessEngine] = []

    def make(**limits) -> ProcessEngine:
        made.append(ProcessEngine(engine.setup, name=f"engine-{len(made)}", limits=EngineLimits(**limits)))
        made[-1].start()
        return made[-1]

    yield make
    for h in made:
        h.close()


def _kill_during_frames(handle: ProcessEngine, sig: int) -> list:
    """A progress callback that sends `sig` to the engine process at its first frame batch."""
    seen: list = []

    def progress(stage: str, done: int, total: int) -> None:
        seen.append((stage, done, total))
        if stage == "frames" and done > 0 and handle.pid:
            os.kill(handle.pid, sig)
    return progress


def test_a_child_engine_writes_the_bytes_of_one_in_this_process_and_cancels(child, engine, clips, tmp_path):
    handle = child()
    assert handle.state().state == "idle" and handle.state().where == f"pid {handle.pid}"
    ref = engine.render(RenderRequest(avatar="anchor", audio=clips[0], output=tmp_path / "ref.mp4"))
    heard: list = []
    got = handle.render(_job(engine, clips[0], tmp_path / "child.mp4", "j1"),
                        progress=lambda *p: heard.append(p))
    assert (tmp_path / "child.mp4").read_bytes() == ref.output.read_bytes()
    assert got.timings["digest"] == ref.timings["digest"] and got.timings["frames"] == ref.timings["frames"]
    assert heard[-1] == ("frames", ref.timings["frames"], ref.timings["frames"])
    assert handle.state().state == "idle" and handle.state().last_beat is not None

    def cancel(stage, done, total):
        if stage == "frames":
            raise JobCancelled()
    with pytest.raises(JobCancelled):
        handle.render(_job(engine, clips[1], tmp_path / "cancelled.mp4"), progress=cancel)
    assert not (tmp_path / "cancelled.mp4").exists() and _leftovers(tmp_path) == []
    # the render's own refusal comes back as the error render gives, and the engine goes on
    (tmp_path / "gone").mkdir()
    with pytest.raises(EngineError) as e:
        handle.render(EngineJob(RenderRequest(avatar="nobody", audio=clips[0], output=tmp_path / "x.mp4"),
                                _job(engine, clips[0], tmp_path / "x.mp4").audio))
    assert e.value.exit_code == 5 and "nobody" in str(e.value)
    assert handle.state().state == "idle" and handle.state().restarts == 0


@pytest.mark.parametrize("sig,word", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")])
def test_an_engine_killed_under_a_job_leaves_nothing_and_a_fresh_one_renders_the_next(child, engine, clips, tmp_path,
                                                                                    sig, word):
    handle = child()
    first = handle.pid
    with pytest.raises(EngineDied, match=word):
        handle.render(_job(engine, clips[0], tmp_path / "a.mp4"), progress=_kill_during_frames(handle, sig))
    state = handle.state()
    assert state.state == "dead" and word in state.last_death
    assert not (tmp_path / "a.mp4").exists()
    assert _leftovers(tmp_path) == []   # the writer's ffmpeg died with its engine; its partial file went with it
    handle.restart()
    assert handle.pid != first and handle.state().restarts == 1 and handle.state().state == "idle"
    ref = engine.render(RenderRequest(avatar="anchor", audio=clips[0], output=tmp_path / "ref.mp4"))
    handle.render(_job(engine, clips[0], tmp_path / "a.mp4"))
    assert (tmp_path / "a.mp4").read_bytes() == ref.output.read_bytes()


def test_an_engine_out_of_memory_says_so_and_exits(child, engine, clips, tmp_path):
    handle = child(beat_s=5.0)          # native code that cannot allocate may hang (OpenBLAS) rather than fail

    def squeeze(stage, done, total):            # the engine's memory capped just above what it holds now
        if stage == "motion" and handle.pid:
            with open(f"/proc/{handle.pid}/status") as f:
                vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
            resource.prlimit(handle.pid, resource.RLIMIT_AS, (vm + (8 << 20), vm + (8 << 20)))
    with pytest.raises(EngineDied, match="out of memory"):
        handle.render(_job(engine, clips[1], tmp_path / "big.mp4"), progress=squeeze)
    assert handle.state().state == "dead" and not (tmp_path / "big.mp4").exists()


def test_an_engine_too_big_for_its_memory_cap_does_not_start(engine):
    handle = ProcessEngine(engine.setup, limits=EngineLimits(memory_bytes=256 << 20))
    with pytest.raises(EngineError, match="memory"):
        handle.start()
    assert handle.state().state == "dead" and "memory" in handle.state().error
    handle.close()


def test_a_hung_engine_is_killed(child, engine, clips, tmp_path):
    handle = child(beat_s=2.0, stall_s=30.0)
    stopped = threading.Event()

    def freeze(stage, done, total):             # SIGSTOP: no heartbeat, no progress, as a hang in native code
        if stage == "frames" and not stopped.is_set():
            stopped.set()
            os.kill(handle.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(EngineDied, match="hung"):
        handle.render(_job(engine, clips[0], tmp_path / "h.mp4"), progress=freeze)
    assert time.monotonic() - t0 < 20 and not (tmp_path / "h.mp4").exists()
    handle.restart()
    assert handle.state().state == "idle"


def test_an_idle_engine_that_dies_is_seen_dead_and_restarted_by_the_next_job(child, engine, clips, tmp_path):
    handle = child()
    os.kill(handle.pid, signal.SIGKILL)
    for _ in range(50):
        if handle.state().state == "dead":
            break
        time.sleep(0.1)
    assert handle.state().state == "dead" and "SIGKILL" in handle.state().last_death
    handle.render(_job(engine, clips[0], tmp_path / "after.mp4"))
    assert (tmp_path / "after.mp4").exists() and handle.state().restarts == 1


def test_the_engine_runs_this_process_s_code_whatever_folder_it_starts_in(engine, tmp_path, monkeypatch):
    """`python -m` would put the working folder first: a checkout of another version there (here a trap) must not
    be what the engine imports."""
    (tmp_path / "ditto_fast").mkdir()
    (tmp_path / "ditto_fast" / "__init__.py").write_text("raise SystemExit('the working folder's ditto_fast')\n")
    monkeypatch.chdir(tmp_path)
    handle = ProcessEngine(engine.setup)
    try:
        handle.start()
        assert handle.state().state == "idle"
    finally:
        handle.close()


def test_a_segfault_s_cause_names_the_crashing_frame_in_a_few_hundred_characters(engine, clips, tmp_path):
    """faulthandler's dump ends with the list of every extension module (thousands of characters): the cause keeps
    the frame it names first under "Current thread", the one that crashed."""
    said: list[str] = []
    handle = ProcessEngine(engine.setup, output=said.append)
    try:
        handle.start()
        with pytest.raises(EngineDied) as died:
            handle.render(_job(engine, clips[0], tmp_path / "a.mp4"), progress=_kill_during_frames(handle,
                                                                                              signal.SIGSEGV))
        state = handle.state()
    finally:
        handle.close()
    dump = [line.split(": ", 1)[1] for line in said if ": " in line]
    frame = dump[next(i for i, line in enumerate(dump) if line.startswith("Current thread")) + 1].strip()
    assert frame.startswith("File ") and any(line.startswith("Extension modules:") for line in dump)
    for cause in (str(died.value), state.last_death):
        assert "SIGSEGV" in cause and frame in cause and "Extension modules" not in cause, cause
        assert len(cause) <= 500, len(cause)
