"""A live session's latency figures stay bounded in memory over a long stream and stay true to it."""

from __future__ import annotations

from fractions import Fraction

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
    lat = st.summary(interrupted=False)["latency_s"]
    assert len(st.latencies.values) <= 20_000
    assert abs(lat["median"] - 1.0) < 1e-6 and lat["max"] == 10.0
