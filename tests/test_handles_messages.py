"""A live session's messages between serve and its engine: typed, speech apart from control. A clear drops speech
only; watch, stop, answers' ends and clears are never dropped or reordered, every clear is answered, and an answer's
end that overtakes its speech still ends the answer where it was said."""

from __future__ import annotations

import pickle
import socket
import threading
from multiprocessing.connection import Connection

import numpy as np

from ditto_fast.handles import messages as m
from ditto_fast.handles.engine_sessions import EngineSessions, _Carried
from ditto_fast.handles.live_link import SessionOrder, LiveLink
from ditto_fast.live.options import LiveRequest
from support import together


class _Engine:
    """What a link sends, held until `go` is set (an engine whose socket is full: busy)."""

    def __init__(self) -> None:
        self.sent: list = []
        self.go = threading.Event()
        self.entered = threading.Event()        # the link's sender is in send(), waiting on the engine
        self.got = threading.Condition()

    def send(self, message) -> None:
        self.entered.set()
        self.go.wait(30)
        with self.got:
            self.sent.append(message)
            self.got.notify_all()

    def until(self, count: int) -> list:
        with self.got:
            assert self.got.wait_for(lambda: len(self.sent) >= count, 30), self.sent
            return list(self.sent)


def _link(engine: _Engine) -> LiveLink:
    link = LiveLink(SessionOrder(LiveRequest(avatar="anchor"), label="s"), engine.send, "engine-0")
    link.state = "streaming"
    return link


def _control(sent: list) -> list:
    return [type(x).__name__ for x in sent if not isinstance(x, m.Speech)]


def test_a_clear_on_a_busy_engine_drops_speech_only():
    engine = _Engine()
    link = _link(engine)
    tone = np.full(320, 0.25, np.float32)
    link.push(tone)                             # taken by the sender, which now waits on the busy engine
    assert engine.entered.wait(30)
    leave = link.watch(lambda media: None)
    for _ in range(5):
        link.push(tone)
    link.end_segment()
    link.clear()
    link.clear()
    link.push(tone)
    leave()
    link.stop("DELETE")
    engine.go.set()
    sent = engine.until(8)
    assert _control(sent) == ["Watch", "SegmentEnd", "Clear", "Clear", "Watch", "End"], sent
    speech = [x for x in sent if isinstance(x, m.Speech)]
    assert len(speech) == 2                     # the one on its way before the clears, and the one after them
    assert next(x for x in sent if isinstance(x, m.End)).why == "DELETE" and [x.watchers for x in sent if isinstance(x, m.Watch)] == [1, 0]
    assert link.pushed == 640                   # the five dropped are not counted as sent
    assert next(x for x in sent if isinstance(x, m.SegmentEnd)).at == 6 * 320    # where the answer ended when said


def test_control_goes_before_waiting_speech():
    """A stop is not stuck behind minutes of speech waiting for the engine."""
    engine = _Engine()
    link = _link(engine)
    for _ in range(200):
        link.push(np.zeros(16000, np.float32))
    assert engine.entered.wait(30)
    link.stop()
    engine.go.set()
    sent = engine.until(201)
    assert isinstance(sent[1], m.End), [type(x).__name__ for x in sent[:3]]


def test_five_hundred_clears_from_threads_all_reach_the_engine():
    engine = _Engine()
    engine.go.set()
    link = _link(engine)

    def clears(i: int) -> None:
        for _ in range(250):
            link.push(np.ones(160, np.float32) * 0.1)
            link.clear()
    together(2, clears)
    with engine.got:
        assert engine.got.wait_for(lambda: sum(isinstance(x, m.Clear) for x in engine.sent) == 500, 30), \
            _control(engine.sent).count("Clear")


def _sessions() -> tuple[EngineSessions, list, _Carried]:
    said: list = []
    sessions = EngineSessions(None, said.append)
    carried = _Carried(SessionOrder(LiveRequest(avatar="anchor"), id="s1"))
    sessions._carried["s1"] = carried
    return sessions, said, carried


def _speech(n: int) -> m.Speech:
    return m.Speech("s1", np.full(n, 1000, "<i2").tobytes(), None)


def test_an_answers_end_that_overtook_its_speech_ends_it_where_it_was_said():
    sessions, said, carried = _sessions()
    sessions.hear(_speech(320))
    sessions.hear(m.SegmentEnd("s1", 960))      # said after 960 samples; 640 of them still on their way
    sessions.hear(_speech(320))
    assert carried.playback.segments[0].end is None
    sessions.hear(_speech(320))
    sessions.hear(_speech(320))                 # the next answer's
    segments = carried.playback.segments
    assert [(s.start, s.end) for s in segments] == [(0, 960), (960, None)]
    events = carried.playback.advance(960)
    assert events[-1] == {"event": "playback_finished", "segment": 1, "position_s": 0.06, "interrupted": False,
                          "frame": -1}


def test_every_clear_is_answered_and_drops_the_pending_ends():
    sessions, said, carried = _sessions()
    sessions.hear(_speech(320))
    sessions.hear(m.SegmentEnd("s1", 640))      # its speech was dropped by the clear before it was sent
    for _ in range(500):
        sessions.hear(m.Clear("s1"))
    cleared = [x.event for x in said if x.event["event"] == "cleared"]
    assert len(cleared) == 500 and carried.ends == [] and carried.source.available() == 0
    finished = [x.event for x in said if x.event["event"] == "playback_finished"]
    assert [(e["segment"], e["interrupted"]) for e in finished] == [(1, True)]
    sessions.hear(_speech(320))                 # speech after the clear opens the next answer, from where it is
    assert [(s.number, s.start) for s in carried.playback.segments] == [(2, 320)]


def test_the_messages_cross_a_socket_as_themselves():
    a, b = socket.socketpair()
    ours, theirs = Connection(a.detach()), Connection(b.detach())
    order = SessionOrder(LiveRequest(avatar="anchor"), label="x")
    sent = [m.Open(order.id, order), _speech(4), m.SegmentEnd(order.id, 4), m.Clear(order.id), m.Watch(order.id, 2),
            m.End(order.id, "no client"), m.Progress("t", "render", 3, 9), m.Outcome("t", ("error", "bad", 2)),
            m.SessionMedia(order.id, 7, b"\x00\x00\x01", True, b"\x01\x00"), m.Stop()]
    for message in sent:
        ours.send(message)
    got = [theirs.recv() for _ in sent]
    assert got == sent and got[8].media == (7, b"\x00\x00\x01", True, b"\x01\x00")
    assert all(isinstance(x, m.SessionMessage) for x in got[:6]) and not isinstance(got[6], m.SessionMessage)
    assert pickle.loads(pickle.dumps(m.End("s"))).why == "stop"
    ours.close()
    theirs.close()


def test_a_session_speaks_until_its_stream_has_sent_what_it_took():
    """Speech taken by the session is still to be said until its stream sends it, a whole delay later: a session
    counts as idle (and its idle timeout runs) only once it has neither speech waiting nor speech unsent (an answer
    sent whole lost its last 0.1 s to a timeout that ran from the moment the speech was taken)."""
    engine = _Engine()
    engine.go.set()
    link = _link(engine)
    assert not link.speaking
    link.push(np.zeros(16000, np.float32))
    assert link.speaking and link.queued_seconds == 1.0
    link.hear(m.SessionStats(link.id, {}, 16000, 4000))         # all taken, a quarter second not yet sent
    assert link.queued_seconds == 0 and link.speaking
    link.hear(m.SessionStats(link.id, {}, 16000, 0))
    assert not link.speaking


def test_a_viewer_that_comes_as_its_session_ends_hears_the_end():
    """A WHEP viewer's offer is answered after the session it asked for ended: its watcher hears the end at once
    (it was added after the end had been told, and its tracks waited for ever)."""
    link = _link(_Engine())
    link.hear(m.SessionEnded(link.id, {}))
    heard: list = []
    leave = link.watch(heard.append)
    assert heard == [None]
    leave()


def test_an_engine_s_sessions_are_named_while_others_open_and_end():
    """The engine's list of its sessions is made while other threads add and drop links (the reader drops one as
    it ends, an HTTP thread adds one): made from a copy, it cannot fail with a changed dict."""
    from ditto_fast.handles.base import EngineState
    from ditto_fast.handles.live_link import state_with

    engine = _Engine()
    links = {str(i): _link(engine) for i in range(3)}

    class Racing:                       # a link whose label is read just as another link of the engine ends
        id = "racing"
        active = True

        @property
        def order(self):
            links.pop("0", None)        # the reader forgets a link meanwhile
            return SessionOrder(LiveRequest(avatar="anchor"), label="racing")

    links["racing"] = Racing()
    assert "racing" in state_with(EngineState("engine-0", "process"), links).sessions
