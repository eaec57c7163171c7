"""A live session's latency figures stay bounded in memory over a long stream and stay true to it."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np

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
