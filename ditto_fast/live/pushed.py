"""Speech handed to a live session by the caller, in process (a Pipecat service gives it its TTS's audio): the same
face to the session as sources.AudioSource (start, take, available, ended, error, close, arrivals), with no reader
thread, and `clear()` for a listener who interrupts. The caller may push the speech as it came beside what the
model hears (`band`: the same speech at STREAM_SAMPLE_RATE), for the stream to carry its own band."""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

import numpy as np

from ditto_fast.live.sources import Arrivals, take_chunks
from ditto_fast.media.rates import BAND_PER_SAMPLE, SPEECH_SAMPLE_RATE

TAKES_KEPT = 4096           # takes whose time is kept (the session takes every 20 ms: over a minute)


class PushedSource:
    """16 kHz mono float32 samples `push`ed by the caller, buffered until the session takes them.

    `end()` says no more will come (the session, run to stop at the end, closes its stream after the last);
    `clear()` drops what is buffered (an interruption). Dropped samples count as taken: the source's sample indices
    (arrival times, take times) run on over them. `taken_at(index)` is when sample `index` was taken.
    """

    def __init__(self, name: str = "pushed speech") -> None:
        self.name = name
        self.sample_rate = SPEECH_SAMPLE_RATE
        self.arrivals = Arrivals()
        self.first_sample_at: float | None = None
        self.received = 0               # samples pushed (cleared ones included)
        self.taken = 0                  # the index of the next sample take() returns
        self.dropped = 0                # samples clear() dropped
        self._chunks: deque[np.ndarray] = deque()
        self._band: deque[np.ndarray] = deque()          # the same speech at the stream's rate, when pushed
        self.has_band = False
        self._available = 0
        self._takes: deque[tuple[int, float]] = deque(maxlen=TAKES_KEPT)     # (index after the take, time)
        self._lock = threading.Lock()
        self._ended = False
        self._closed = False

    def start(self) -> PushedSource:
        """Nothing to start (the caller pushes); returns self."""
        return self

    def push(self, samples: np.ndarray, band: np.ndarray | None = None) -> None:
        """Add float32 samples in [-1, 1) at 16 kHz (with `band`, the same speech at the stream's 48 kHz); ignored
        after end() or close()."""
        samples = np.asarray(samples, np.float32).reshape(-1)
        band = None if band is None else np.asarray(band, np.float32).reshape(-1)
        now = time.monotonic()
        with self._lock:
            if self._ended or self._closed:
                return
            if band is not None:            # in step with the samples (audio/resample.BandResampler gives them so)
                self.has_band = True
                if len(band):
                    self._band.append(band.copy())
            if not len(samples):
                return
            start = self.received
            self._chunks.append(samples.copy())
            self._available += len(samples)
            self.received += len(samples)
            if self.first_sample_at is None:
                self.first_sample_at = now
        self.arrivals.note(start, start + len(samples), now)

    def clear(self) -> int:
        """Drop the samples not yet taken; returns how many."""
        with self._lock:
            dropped = self._available
            self._chunks.clear()
            self._band.clear()
            self._available = 0
            self.taken += dropped
            self.dropped += dropped
            if dropped:
                self._takes.append((self.taken, time.monotonic()))
        return dropped

    def end(self) -> None:
        """No more speech will come: once what is buffered has been taken, the source has ended."""
        with self._lock:
            self._ended = True

    def take(self, n: int) -> np.ndarray:
        """Up to `n` buffered samples, float32 [<= n], without waiting (empty when none are buffered)."""
        with self._lock:
            out = take_chunks(self._chunks, n)
            self._available -= len(out)
            self.taken += len(out)
            if len(out):
                self._takes.append((self.taken, time.monotonic()))
        return out

    def take_band(self, n: int) -> np.ndarray | None:
        """The band of the `n` samples take() gave last: [n * 3] float32 at 48 kHz (zeros where a caller's band ran
        short of its samples); None when the caller pushes no band."""
        if not self.has_band:
            return None
        with self._lock:
            out = take_chunks(self._band, n * BAND_PER_SAMPLE)
        return out if len(out) == n * BAND_PER_SAMPLE else np.concatenate(
            [out, np.zeros(n * BAND_PER_SAMPLE - len(out), np.float32)])

    def available(self) -> int:
        """Samples buffered now."""
        with self._lock:
            return self._available

    def taken_at(self, index: int) -> float | None:
        """time.monotonic() when sample `index` was taken (or dropped); None if not yet, or no longer kept."""
        with self._lock:
            i = bisect.bisect_right(self._takes, index, key=lambda take: take[0])
            return self._takes[i][1] if i < len(self._takes) else None

    @property
    def ended(self) -> bool:
        """end() was called (what is buffered can still be taken)."""
        return self._ended

    @property
    def error(self) -> str | None:
        """Always None: pushed speech cannot fail."""
        return None

    def close(self) -> None:
        """Drop what is buffered; later pushes are ignored (idempotent)."""
        with self._lock:
            self._closed = True
            self._chunks.clear()
            self._band.clear()
            self._available = 0
