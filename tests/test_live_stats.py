"""A live session's latency figures stay bounded in memory over a long stream and stay true to it."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from ditto_fast.live.stats import LiveStats, Reservoir


def test_reservoir_is_bounded_and_uniform():
    r = Reservoir(size=1000)
    for v in range(200_000):                 # over an hour of arrivals at ~50 a second
        r.add(float(v))
    assert len(r.values) == 1000 and r.seen == 200_000 and r.max == 199_999.0
    # a uniform sample of 0..199999: its median near 100000, its spread the whole range (a recent-only window fails)
    assert abs(np.median(r.values) - 100_000) < 10_000
    assert min(r.values) < 10_000 and max(r.values) > 190_000


def test_stats_latency_quantiles_come_from_the_sample():
    st = LiveStats(Fraction(25))
    for i in range(30_000):
        st.latency(sent=10.0 + i * 0.02, arrivals=[i * 0.02 + 9.0], first_speech=None, samples=(0, 640))
    st.latency(sent=1000.0, arrivals=[990.0], first_speech=None, samples=(0, 640))     # one stall
    lat = st.summary()["latency_s"]
    assert len(st.latencies.values) <= 20_000
    assert abs(lat["median"] - 1.0) < 1e-6 and lat["max"] == 10.0


def test_speech_that_came_in_a_burst_counts_from_its_turn_not_its_arrival():
    """A TTS writing a 10 s answer at once: the picture's delay is fixed (1.5 s here); the speech waiting for its turn
    to be spoken is no delay a viewer sees (counted from its arrival, p95 was 9.5 s, over any --max-latency)."""
    rate, delay = Fraction(25), 1.5
    burst, steady = LiveStats(rate), LiveStats(rate)
    for st in (burst, steady):
        st.audio = SimpleNamespace(start=100.0, jitter=0.1, speech=160_000)
    for i in range(250):                                     # 10 s of slots, 640 samples each
        a, b = i * 640, (i + 1) * 640
        sent = 100.0 + delay + i / 25
        burst.latency(sent, [100.0], (0, 100.0), (a, b))     # every block arrived at the start
        steady.latency(sent, [100.0 + i / 25 + 0.01], (0, 100.01), (a, b))     # each as it is spoken
    lat = burst.summary()["latency_s"]
    assert abs(lat["median"] - delay) < 1e-6 and abs(lat["p95"] - delay) < 1e-6 and abs(lat["max"] - delay) < 1e-6
    assert abs(burst.first_frame - delay) < 1e-6
    lat = steady.summary()["latency_s"]     # speech that comes at its pace: from its arrival
    assert abs(lat["median"] - (delay - 0.01)) < 1e-6 and abs(steady.first_frame - (delay - 0.01)) < 1e-6


def test_help_says_what_the_latency_counts(run_cli):
    r = run_cli(["live", "--help"])
    assert "Latency is what a viewer sees" in " ".join(r.stdout.split())


def send(st: LiveStats, on_time: int = 0, repeated: int = 0, held: int = 0) -> None:
    """The output thread's count of slots sent, as session.py keeps it."""
    st.sent += on_time
    st.repeated += repeated
    st.held += held
    st.slots += on_time + repeated + held


def test_skipped_counts_only_slots_that_were_sent():
    """The frames thread gives up on slots by the clock plus its render estimate, ahead of the output: a 1.4 s
    render estimate gives up on the next 35 slots at once. A stream that stopped after 30 slots said "30 frames: 0
    on time, 0 repeated, 34 skipped, 30 held"; of the frames sent, no more can have been skipped than went out
    repeated or held."""
    st = LiveStats(Fraction(25))
    st.skip(0, 34)                      # given up on slots 0..33 while the output held the plate
    send(st, held=30)                   # the stream stopped after 30 slots
    f = st.summary("interrupt")["frames"]
    assert (f["sent"], f["held"], f["skipped"]) == (30, 30, 30), f
    line = LiveStats.line(st.summary("interrupt"))
    assert "30 frames: 0 on time, 0 repeated, 30 held (30 of these skipped" in line, line


def test_the_line_s_figures_add_up_over_a_long_stream():
    """Runs given up on, some sent and some beyond the stream's end, counted once each; on time + repeated + held is
    every frame sent, and skipped is among the repeated and held."""
    st = LiveStats(Fraction(25))
    for k in range(1000):               # 1000 rounds of 10 slots: 6 made in time, 4 given up on (sent repeated)
        st.skip(10 * k + 6, 10 * k + 10)
        send(st, on_time=6, repeated=4)
    st.skip(10_000, 10_040)             # the frames thread's last run, past the stream's end
    assert len(st._skips._runs) <= 2    # runs wholly sent are folded as it goes: bounded memory for a day's stream
    f = st.summary("interrupt")["frames"]
    assert f["sent"] == 10_000 and f["on_time"] + f["repeated"] + f["held"] == f["sent"]
    assert f["skipped"] == 4000 <= f["repeated"] + f["held"], f
    line = LiveStats.line(st.summary("interrupt"))
    assert "10000 frames: 6000 on time, 4000 repeated, 0 held (4000 of these skipped" in line, line


def test_the_streams_delay_is_said_in_its_parts():
    """The latency budget: at Ditto's overlap 70 (10 new frames a window) the floor with no compute at all is 1.065 s
    (0.1 jitter + 20 rows in lumps of 5 + 85 ms look-ahead + two frames of cushion); at overlap 78 it is 0.465 s;
    what the clock's start shows beyond it is compute (the first frame's, and the cushion sized from it)."""
    st = LiveStats(Fraction(30))
    st.budget(1.775, 10, 0.1, 0.48)
    b = st.summary()["latency_budget_ms"]
    assert b == {"jitter": 100.0, "speech_rows": 800.0, "look_ahead": 85.0, "cushion": 480.0, "floor": 1065.0,
                 "compute": 710.0, "delay": 1775.0}
    st.budget(0.4, 2, 0.1, 0.08)
    b = st.summary()["latency_budget_ms"]
    assert b["floor"] == 465.0 and b["compute"] == 0.0 and b["speech_rows"] == 200.0
    assert LiveStats(Fraction(25)).summary()["latency_budget_ms"] is None         # before the clock starts


def test_the_clock_waits_two_frames_and_the_first_frames_compute_again_at_most_a_window():
    """The clock's cushion after the first frame: each later window's frames come with their speech, a window after the
    last, so it need only cover a window computing slower than the first: two frames and that compute again, never
    more than the window and two frames the clock always waited."""
    from ditto_fast.live.stats import clock_cushion, speech_floor

    assert clock_cushion(10, 0.0) == pytest.approx(0.08)            # no compute: two frames at 25 fps
    assert clock_cushion(10, 0.1) == pytest.approx(0.18)
    assert clock_cushion(10, 2.0) == pytest.approx(0.48)            # at most a window (10 frames) and two
    assert clock_cushion(5, 0.5) == pytest.approx(0.28) and clock_cushion(10, -0.1) == pytest.approx(0.08)
    assert sum(speech_floor(10, 0.1).values()) == pytest.approx(0.985)
