"""The engine in this process (handles/local.py's LocalEngine), the one place the networks load: its render jobs
through the one job state machine (the same bytes as the Renderer itself), a refusal as plain outcome data, and a
live session carried in process, its frames and events counted against what it says it sent."""

from __future__ import annotations

import threading
import time

import pytest
import soundfile as sf

from ditto_fast.core.errors import DittoError
from ditto_fast.engine.clip import check_clip
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles.base import EngineError, EngineJob, JobCancelled
from ditto_fast.handles.live_link import SessionOrder
from ditto_fast.handles.local import LocalEngine, load_renderer
from ditto_fast.live.options import LiveRequest


def _job(engine, clip, output, avatar: str = "anchor") -> EngineJob:
    request = RenderRequest(avatar="anchor", audio=clip, output=output)
    audio = check_clip(request, engine.avatar("anchor"), engine.config).audio
    return EngineJob(RenderRequest(avatar=avatar, audio=clip, output=output), audio, label="j1")


def _until(predicate, what, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def test_an_engine_loaded_here_renders_the_same_bytes_as_the_renderer(engine, clips, tmp_path):
    """start() loads the networks from the setup; its render, through the job state machine, is the Renderer's own to the byte; the commit comes before the rename."""
    ref = engine.render(RenderRequest(avatar="anchor", audio=clips[1], output=tmp_path / "ref.mp4"))
    local = LocalEngine(engine.setup, name="local-0")
    assert local.state().state == "starting" and not local.loaded
    assert local.start() is local and local.loaded and local.renderer is not engine
    assert local.info["load_seconds"] > 0 and local.state().state == "idle"
    ticks: list[tuple] = []
    committed: list[bool] = []
    busy: list[str] = []

    def progress(stage: str, done: int, total: int) -> None:
        ticks.append((stage, done, total))
        busy.append(local.state().state)

    def commit() -> None:
        committed.append((tmp_path / "local.mp4").exists())

    result = local.render(_job(engine, clips[1], tmp_path / "local.mp4"), progress, commit)
    assert result.output.read_bytes() == ref.output.read_bytes()
    # the load is the first render's, as `render` has always said it (an engine process says it apart when ready)
    assert result.timings["stages"]["load_models"] == round(local.renderer.load_seconds, 4), result.timings
    assert committed == [False] and ticks and set(busy) == {"busy"}
    assert local.state().state == "idle" and local.state().job is None


def test_a_refused_job_is_plain_outcome_data_and_an_engine_error(engine, clips, tmp_path):
    """What an engine process sends and a Ray actor returns for a job the engine refuses: ("error", line, code); the
    handle raises it as EngineError with the same line and code, and the engine goes on."""
    local = LocalEngine(renderer=engine)
    job = _job(engine, clips[0], tmp_path / "never.mp4", avatar="nobody")
    with pytest.raises(DittoError) as refused:
        engine.avatar("nobody")
    outcome = local.outcome(job)
    assert outcome == ("error", str(refused.value), refused.value.exit_code) and "nobody" in outcome[1], outcome
    with pytest.raises(EngineError) as raised:
        local.render(job)
    assert str(raised.value) == outcome[1] and raised.value.exit_code == outcome[2]
    assert local.state().state == "idle" and not (tmp_path / "never.mp4").exists()


def test_a_cancelled_job_leaves_nothing(engine, clips, tmp_path):
    local = LocalEngine(renderer=engine)

    def cancel(stage: str, done: int, total: int) -> None:
        raise JobCancelled()

    assert local.outcome(_job(engine, clips[0], tmp_path / "c.mp4"), cancel) == ("cancelled",)
    with pytest.raises(JobCancelled):
        local.render(_job(engine, clips[0], tmp_path / "c.mp4"), commit=lambda: (_ for _ in ()).throw(
            JobCancelled()))
    assert list(tmp_path.iterdir()) == []


def test_load_renderer_goes_through_the_one_engine(engine, monkeypatch):
    """render, live and the Pipecat service load through load_renderer: from a setup or from engine options."""
    import ditto_fast.engine.renderer as renderer

    made: list[dict] = []

    class Counted:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.setup, self.load_seconds = engine.setup, 0.5

    monkeypatch.setattr(renderer, "Renderer", Counted)
    from ditto_fast.engine.options import EngineOptions

    options = EngineOptions(device="cpu")
    assert isinstance(load_renderer(engine.setup), Counted) and isinstance(load_renderer(options), Counted)
    assert made == [{"setup": engine.setup, "options": None}, {"setup": None, "options": options}]


def test_a_live_session_runs_in_process_its_frames_counted(engine, speech_wav, tmp_path):
    """open_live() carries the session on this engine with no socket: its link's messages go straight to the
    session and back. Every frame the session says it sent reaches the watcher, one after another from 0, and the
    speech pushed is all taken; ready once, ended last, and off the engine's state as it is told; close() leaves
    nothing carried."""
    local = LocalEngine(renderer=engine, name="local-1")
    heard: list[str] = []
    carried: dict[str, list[str]] = {}
    order = SessionOrder(LiveRequest(avatar="anchor", max_latency=3.0), label="s1")
    link = local.open_live(order, heard=lambda event, detail: (heard.append(event),
                                                                carried.setdefault(event, local.state().sessions)))
    frames: list[int] = []
    ended = threading.Event()

    def take(media) -> None:
        if media is None:
            ended.set()
        else:
            frames.append(media[0])

    link.watch(take)
    _until(lambda: link.state == "streaming", f"the session started: {link.state} {link.error}")
    streaming = local.state()
    assert streaming.sessions == ["s1"] and link.engine == "local-1"
    speech, rate = sf.read(speech_wav, dtype="float32", frames=16000)
    assert rate == 16000
    for i in range(0, len(speech), 3200):
        link.push(speech[i:i + 3200])
    _until(lambda: link.stats and link.taken >= len(speech) or not link.active,
           lambda: f"the speech was taken: {link.taken} of {len(speech)}, {link.state} {link.error}")
    assert link.taken >= len(speech), (link.taken, link.state, link.error)
    _until(lambda: link.last_frames > 0 or not link.active,               # a loaded host's clock starts late
           lambda: f"a frame was sent: {link.stats}, {link.state} {link.error}")
    link.stop()
    assert link.wait(120) and link.state == "ended", link.error
    assert heard.count("ready") == 1 and heard[-1] == "ended", heard
    assert carried["ready"] == ["s1"] and carried["ended"] == [] and streaming.sessions == ["s1"], carried
    sent = link.stats["frames"]["sent"]
    assert sent > 0 and ended.wait(10)
    assert frames == list(range(sent)), (len(frames), sent)
    assert local.state().sessions == []
    local.close()
    assert local.state().state == "idle"
