"""The parent<->engine handshake, written once (wire.py's WiredEngine on the parent's side, engine_side.serve_engine
on the engine's) and run here over a socket pair with the engine's side on a thread of this process, on the tests'
loaded engine: the same messages an engine process and a Ray actor exchange with their parent. A render's progress
arrives, a cancel mid-render leaves nothing at the output, a commit answered go puts the file in place and one
answered cancel leaves nothing; a live session's frames all come back over the wire; a wire cut under a session ends
it with the cause."""

from __future__ import annotations

import os
import socket
import threading
import time
from multiprocessing.connection import Connection

import pytest
import soundfile as sf

from ditto_fast.engine.clip import check_clip
from ditto_fast.engine.request import RenderRequest
from ditto_fast.handles import messages as m
from ditto_fast.handles.base import EngineJob, EngineLimits, JobCancelled
from ditto_fast.handles.engine_side import serve_engine
from ditto_fast.handles.live_link import SessionOrder
from ditto_fast.handles.local import LocalEngine
from ditto_fast.handles.wire import WiredEngine
from ditto_fast.live.options import LiveRequest


class ThreadEngine(WiredEngine):
    """An engine whose life is a thread of this process serving one end of a socket pair (a process's or an actor's
    life is process.py's or ray_engine.py's): the tests' loaded renderer, no load of its own."""

    kind = "thread"
    noun = "its thread"

    def __init__(self, renderer, limits: EngineLimits = EngineLimits()):
        super().__init__("wired-0", limits)
        self.renderer, self.exits = renderer, []

    def _launch(self) -> Connection:
        ours, theirs = socket.socketpair()
        thread = threading.Thread(target=self._serve, args=(theirs,), name="wired-engine", daemon=True)
        self._life = (thread, theirs)
        self._state.where = "a thread"
        thread.start()
        return Connection(ours.detach())

    def _serve(self, theirs: socket.socket) -> None:
        """The engine's side until Stop; then its end of the wire shut, as an exiting process's closes."""
        try:
            serve_engine(Connection(os.dup(theirs.fileno())), self._load, self._exit)
        finally:
            _shut(theirs)

    def _load(self, start: m.Start, tell) -> LocalEngine:
        assert start.setup == self.renderer.setup and start.memory_bytes is None
        self.local = LocalEngine(renderer=self.renderer, tell=tell)
        return self.local

    def _exit(self, code: int) -> None:
        """What the engine's side does when its parent is gone: an engine process exits; here its sessions end."""
        self.exits.append(code)
        self.local.close()

    def _start_message(self) -> m.Start:
        return m.Start(self.renderer.setup, None)

    def _end(self, life, stacks: bool) -> None:
        _shut(life[1])                              # both ends read EOF: the engine's side hears its parent gone

    def _death(self, life) -> str:
        return "its socket was shut"


def _shut(end: socket.socket) -> None:
    try:
        end.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass                                        # shut already


@pytest.fixture
def wired(engine):
    handle = ThreadEngine(engine)
    handle.start()
    yield handle
    handle.close()


def _job(engine, clip, output) -> EngineJob:
    request = RenderRequest(avatar="anchor", audio=clip, output=output)
    return EngineJob(request, check_clip(request, engine.avatar("anchor"), engine.config).audio, label="j")


def _until(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_render_over_the_wire_says_its_progress_and_waits_for_go(wired, engine, clips, tmp_path):
    """Ready, then a render: its progress heard here frame batch by frame batch, its commit asked before the rename
    (nothing in place yet), the file in place after go, the same bytes as the engine's own render."""
    assert wired.state().state == "idle" and wired.info["pid"] > 0
    ref = engine.render(RenderRequest(avatar="anchor", audio=clips[1], output=tmp_path / "ref.mp4"))
    ticks: list[tuple] = []
    committed: list[bool] = []
    result = wired.render(_job(engine, clips[1], tmp_path / "w.mp4"), lambda *tick: ticks.append(tick),
                          lambda: committed.append((tmp_path / "w.mp4").exists()))
    frames = [t for t in ticks if t[0] == "frames"]
    assert frames and frames[-1][1] == frames[-1][2] == result.timings["frames"], ticks
    assert committed == [False] and result.output.read_bytes() == ref.output.read_bytes()
    assert wired.state().state == "idle" and wired.state().last_beat is not None


def test_a_cancel_mid_render_and_a_commit_answered_cancel_leave_nothing(wired, engine, clips, tmp_path):
    """A cancel raised by the progress callback reaches the engine, which stops at its next frame batch; a commit
    answered cancel stops the rename. Nothing is left at either output (nor a part file), and the engine renders
    on: the next job's commit answered go puts its file in place."""
    def cancel_at_frames(stage: str, done: int, total: int) -> None:
        if stage == "frames":
            raise JobCancelled()

    with pytest.raises(JobCancelled):
        wired.render(_job(engine, clips[2], tmp_path / "mid.mp4"), cancel_at_frames)
    asked: list[bool] = []

    def refuse() -> None:
        asked.append(True)
        raise JobCancelled()

    with pytest.raises(JobCancelled):
        wired.render(_job(engine, clips[0], tmp_path / "refused.mp4"), commit=refuse)
    assert asked == [True] and list(tmp_path.iterdir()) == []
    assert wired.state().state == "idle"
    wired.render(_job(engine, clips[0], tmp_path / "go.mp4"), commit=lambda: None)
    assert [p.name for p in tmp_path.iterdir()] == ["go.mp4"]


def test_a_live_session_over_the_wire_and_a_cut_wire(wired, engine, speech_wav, tmp_path):
    """A session opened over the wire streams on the engine's side: every frame it says it sent reaches the watcher
    here, in order, and its speech is all taken. A second session, its wire cut, fails with its engine's cause; the
    idle engine is marked dead with it, and its side hears its parent gone."""
    order = SessionOrder(LiveRequest(avatar="anchor", max_latency=3.0), label="s1")
    heard: list[str] = []
    link = wired.open_live(order, heard=lambda event, detail: heard.append(event))
    frames: list[int] = []
    link.watch(lambda media: frames.append(media[0]) if media is not None else None)
    _until(lambda: link.state == "streaming", f"the session started: {link.state} {link.error}")
    assert wired.state().sessions == ["s1"]
    speech, _ = sf.read(speech_wav, dtype="float32", frames=16000)
    for i in range(0, len(speech), 3200):
        link.push(speech[i:i + 3200])
    _until(lambda: link.stats and link.taken >= len(speech), "the speech was taken")
    link.stop()
    assert link.wait(120) and link.state == "ended", link.error
    sent = link.stats["frames"]["sent"]
    assert sent > 0 and frames == list(range(sent)) and heard.count("ready") == 1 and heard[-1] == "ended"
    _until(lambda: wired.state().sessions == [], "the ended session was forgotten")

    cut = wired.open_live(SessionOrder(LiveRequest(avatar="anchor", max_latency=3.0), label="s2"))
    _until(lambda: cut.state == "streaming", f"the second session started: {cut.error}")
    wired._end(wired._life, False)                  # the wire cut under the session (its engine gone)
    assert cut.wait(30) and cut.state == "failed", cut.state
    assert cut.error == "its engine wired-0 died (its socket was shut)", cut.error
    _until(lambda: wired.state().state == "dead", "the idle engine was marked dead")
    assert wired.state().last_death == "died while carrying 1 live session (its socket was shut)"
    assert wired.state().sessions == []
    _until(lambda: set(wired.exits) == {0}, f"the engine's side heard its parent gone: {wired.exits}")


def test_the_doorway_takes_only_callers_that_hold_its_key():
    """Where Ray actors dial their driver: a caller with another key is refused by the HMAC challenge before it can
    send anything; one that connects and says nothing does not keep the next caller out; a caller with the key and
    a name is handed, by that name, to whoever waits for it, and the connection carries messages both ways."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from ditto_fast.handles.wire import Doorway

    door = Doorway("127.0.0.1")
    try:
        assert len(door.authkey) == 32
        with pytest.raises(AuthenticationError):
            Client(door.address, authkey=bytes(32))
        silent = socket.create_connection(door.address)       # a stranger that never answers the challenge
        caller = Client(door.address, authkey=door.authkey)
        caller.send("actor-7")
        taken = door.take("actor-7", 30)
        assert taken is not None and door.take("actor-7", 0.1) is None and door.take("stranger", 0.1) is None
        taken.send(m.Go("t"))
        assert caller.recv() == m.Go("t")
        caller.send(m.Beat(1.0))
        assert taken.recv() == m.Beat(1.0)
        silent.close()
    finally:
        door.close()
