"""What the listener heard: segments of pushed speech, their playback started and finished (whole, or interrupted
with how much went out), in order."""

from __future__ import annotations

from ditto_fast.live.playback import Playback


def test_segments_start_and_finish_as_playback_reaches_them():
    p = Playback()
    p.pushed(0, 16000)
    p.pushed(16000, 16000)                  # the same answer
    p.end_segment(32000)
    p.pushed(32000, 8000)
    p.end_segment(40000)
    assert p.advance(0) == []
    assert p.advance(1) == [{"event": "playback_started", "segment": 1, "frame": -1}]
    assert p.advance(31999) == []
    assert p.advance(32000, 50) == [{"event": "playback_finished", "segment": 1, "position_s": 2.0, "interrupted": False, "frame": 50}]
    assert p.advance(40000) == [{"event": "playback_started", "segment": 2, "frame": -1},
                                {"event": "playback_finished", "segment": 2, "position_s": 0.5, "interrupted": False, "frame": -1}]
    assert p.advance(50000) == [] and p.segments == []


def test_an_interruption_finishes_every_unfinished_segment_with_what_went_out():
    p = Playback()
    p.pushed(0, 32000)
    p.end_segment(32000)
    p.pushed(32000, 16000)                  # an answer still coming when the caller interrupts
    assert p.interrupt(8000) == [{"event": "playback_started", "segment": 1, "frame": -1},
                                 {"event": "playback_finished", "segment": 1, "position_s": 0.5, "interrupted": True, "frame": -1},
                                 {"event": "playback_finished", "segment": 2, "position_s": 0.0, "interrupted": True, "frame": -1}]
    p.pushed(60000, 1600)                   # after the interruption: a new answer
    assert p.segments[0].number == 3 and p.segments[0].start == 60000


def test_an_empty_answer_is_no_segment():
    p = Playback()
    p.end_segment(0)
    assert p.segments == [] and p.advance(10) == []
