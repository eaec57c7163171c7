"""The bookkeeping both Pipecat faces share (live/held.py), without Pipecat: frames held after speech until it has
been shown, an interruption's non-interruptible frames kept, the muted window; and a live session's states, declared
once (live/states.py) and derived by serve."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ditto_fast.live.held import Held, Mute
from ditto_fast.live.states import ACTIVE, IDLE, STATES


@dataclass
class Frame:
    name: str
    interruptible: bool = True


def test_a_frame_after_speech_waits_until_that_speech_is_shown_and_keeps_its_order():
    held, shown = Held(), {"samples": 0}
    stopped, text = Frame("TTSStoppedFrame"), Frame("TTSTextFrame")
    assert held.hold(16000, stopped, lambda: shown["samples"] >= 16000)        # one second given, none shown
    assert held.hold(16000, text, lambda: True)            # shown, but one waits before it: it goes after that one
    assert held.release(lambda mark: shown["samples"] >= mark) == []
    shown["samples"] = 15999
    assert held.release(lambda mark: shown["samples"] >= mark) == []          # its last sample not yet out
    shown["samples"] = 16000
    assert held.release(lambda mark: shown["samples"] >= mark) == [stopped, text]
    assert len(held) == 0
    assert not held.hold(16000, Frame("next"), lambda: True)                  # nothing waits: it passes at once


def test_frames_are_released_through_the_utterance_played_and_no_further():
    held = Held()
    first, second = Frame("end of 1"), Frame("end of 2")
    held.hold(1, first)
    held.hold(2, second)
    assert held.through(0) == []
    assert held.through(1) == [first]
    assert held.through(1) == []
    assert held.through(2) == [second]


def test_an_interruption_keeps_the_frames_that_are_not_interruptible_and_drops_the_rest():
    held = Held()
    text, function_call, stopped = Frame("text"), Frame("function call", interruptible=False), Frame("stopped")
    for f in (text, function_call, stopped):
        held.hold(5, f)
    assert held.interrupt() == [function_call]
    assert len(held) == 0 and held.through(math.inf) == []


def test_drain_lets_every_held_frame_go_in_order():
    held = Held()
    frames = [Frame(str(i), interruptible=bool(i % 2)) for i in range(4)]
    for i, f in enumerate(frames):
        held.hold(i, f)
    assert held.drain() == frames and len(held) == 0


def test_samples_before_the_mark_are_muted_and_a_later_cut_only_grows_the_window():
    mute = Mute()
    assert not mute.muted(0, now=0.0)
    mute.extend(4800)
    assert mute.muted(4799, now=0.0) and not mute.muted(4800, now=0.0)
    mute.extend(100)                                   # an older cut cannot shorten the window
    assert mute.until == 4800


def test_frames_muted_through_the_one_the_far_end_names_then_speech_is_heard_again():
    mute = Mute()
    mute.unknown(now=10.0, wait=2.0)                   # the clear sent: all muted until the server says
    assert mute.muted(11, now=10.1) and mute.muted(12, now=10.2)
    mute.said(13 + 1)                                  # `cleared` names frame 13
    assert mute.muted(13, now=10.3)
    assert not mute.muted(14, now=10.4)                # the next answer's speech is heard


def test_a_far_end_that_never_says_is_muted_until_the_deadline_then_heard_from_there():
    mute = Mute()
    mute.unknown(now=10.0, wait=2.0)
    assert mute.muted(11, now=11.0) and mute.muted(12, now=12.0)
    assert not mute.muted(13, now=12.1)                # past the deadline: heard from this frame on
    assert not mute.muted(14, now=12.2) and mute.until == 13


def test_a_live_session_has_one_set_of_states_and_serve_adds_only_idle():
    from ditto_fast.handles import live_link
    from ditto_fast.serve.live import sessions

    assert STATES == ("starting", "streaming", "ending", "ended", "failed") and set(ACTIVE) < set(STATES)
    assert live_link.ACTIVE is ACTIVE
    assert [s for s in sessions.STATES if s != IDLE] == list(STATES)
    assert [s for s in sessions.ACTIVE if s != IDLE] == list(ACTIVE)
    assert sessions.STATES.index(IDLE) == sessions.STATES.index("streaming") + 1
