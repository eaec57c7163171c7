"""The live stream's audio on the wall clock: what the source gave, silence where it gave nothing in time. The
stream carries it at 48 kHz: the speech as it came where the source has its band (pushed speech), else what the
model hears, upsampled.

Stream sample p (16 kHz) is due `IN_JITTER` seconds after p / 16000 s of the stream's wall time: by then the source's
next samples are taken if they came, and silence stands in for what did not (a quiet feed, a pause between
answers). Speech that starts after silence waits until it has a cushion (`hold`: IN_JITTER at first; raised, up to
HOLD_MAX_S, each time speech ran dry and came back within RESUMED_S, i.e. came late), so that pieces sent at the pace
they are spoken, each a little late, leave no holes of silence in it. Speech that comes faster than it is spoken (a TTS engine writing a whole answer at once) waits in the
source's buffer and is taken at the pace it is spoken. Every block taken from the source is remembered with its
arrival time, so the output can say how long each piece of speech took to leave as picture.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from ditto_fast.media.rates import BAND_PER_SAMPLE, SPEECH_SAMPLE_RATE, STREAM_SAMPLE_RATE

IN_JITTER = 0.1         # seconds a source's samples may come late before silence stands in for them
HOLD_MAX_S = 0.5        # the most a new run of speech waits for its cushion
RESUMED_S = 0.6         # speech back within this long after running dry had come late (a longer gap is a pause)
KEEP_SECONDS = 120      # audio kept behind the newest sample for the output (far more than any latency allowed)


class StreamAudio:
    """The stream's 16 kHz audio, decided sample by sample as the wall clock passes (see the module's docstring)."""

    def __init__(self, source, start: float, jitter: float = IN_JITTER):
        self.source, self.start, self.jitter = source, start, jitter
        self._ring = np.zeros(KEEP_SECONDS * SPEECH_SAMPLE_RATE, np.float32)   # stream sample p at p % len
        self._band = np.zeros(KEEP_SECONDS * STREAM_SAMPLE_RATE, np.float32)   # its 48 kHz, at 3p ... 3p + 2
        self._band_length = 0
        self._upsample = None                     # 16 -> 48 kHz, for a source without its band
        self.length = 0                           # samples decided so far
        self.arrivals: collections.deque = collections.deque(maxlen=4096)    # (stream pos, arrived at), in order
        self.first_speech: tuple[int, float] | None = None                   # (stream pos, arrived at)
        self.speech_end = 0                       # stream position after the last sample the source gave
        self.closed_at: int | None = None         # stream length when the source ran dry for good
        self.takes: collections.deque = collections.deque(maxlen=4096)   # (stream pos, source index, samples)
        self.hold = jitter                        # seconds a run of speech after silence waits for its cushion
        self.flowing = False                      # whether the last samples decided were speech
        self.ran_dry_at: float | None = None      # when the speech last ran out
        self.late = 0                             # times speech ran dry and came back late: holes of silence
        self._lock = threading.Lock()             # the rings, read by the output while written
        self._deciding = threading.Lock()         # one decision at a time

    def due(self, now: float) -> int:
        """Samples the stream must hold by wall time `now`."""
        return max(0, int((now - self.start - self.jitter) * SPEECH_SAMPLE_RATE))

    def advance(self, now: float, end_with_source: bool = False) -> np.ndarray:
        """Decide the stream up to due(now): the source's samples first, silence for the rest; returns the new samples
        [n] float32. With `end_with_source` (--stop-at-end) a source that has ended and given all it had closes the
        stream after its last sample (no silence after it)."""
        with self._deciding:        # the motion thread decides as it goes, the output before each slot leaves
            return self._advance(now, end_with_source)

    def _advance(self, now: float, end_with_source: bool) -> np.ndarray:
        want = self.due(now) - self.length
        if self.closed_at is not None or want <= 0:
            return np.zeros(0, np.float32)
        ended = end_with_source and self.source.ended          # read first: its last samples are in by then
        first = self.source.taken                               # the source's index of the first sample taken now
        got = self.source.take(0 if self._cushioning(now, first, ended) else want)
        ending = ended and self.source.available() == 0
        if len(got) and not self.flowing:
            gap = (self.source.arrivals.arrival_time(first) or now) - (self.ran_dry_at or float("-inf"))
            if gap < RESUMED_S:                                 # it came late: the next run waits longer
                self.hold = min(HOLD_MAX_S, max(self.hold, gap))
                self.late += 1
        if len(got) < want and (self.flowing or len(got)):
            self.ran_dry_at = now
        self.flowing = len(got) == want
        if len(got):
            take = (self.length, first, len(got))
            self.speech_end = self.length + len(got)
            arrived = self.source.arrivals.arrival_time(first) or now
            self.arrivals.append((self.length, arrived))
            if self.first_speech is None:
                self.first_speech = (self.length, arrived)
        new = got if ending else np.concatenate([got, np.zeros(want - len(got), np.float32)])
        band = self.source.take_band(len(got))
        if band is not None:
            band = np.concatenate([band, np.zeros((len(new) - len(got)) * BAND_PER_SAMPLE, np.float32)])
        else:
            band = self._upsampled(new, last=ending)
        with self._lock:             # source_index walks the takes from another thread
            if len(got):
                self.takes.append(take)
            _write_ring(self._ring, self.length, new)
            _write_ring(self._band, self._band_length, band)
            self.length += len(new)
            self._band_length += len(band)
            if ending:
                self.closed_at = self.length
        return new

    def _cushioning(self, now: float, first: int, ended: bool) -> bool:
        """Whether speech that starts after silence still waits for its cushion (`hold` s of it buffered, or its
        first sample `hold` s old); a source that has ended gives what it has at once."""
        if self.flowing or ended:
            return False
        available = self.source.available()
        arrived = self.source.arrivals.arrival_time(first) if available else None
        return arrived is not None and now < arrived + self.hold and available < self.hold * SPEECH_SAMPLE_RATE

    def _upsampled(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """What the model hears at the stream's rate (a source without its band); `last`: the resampler's tail too
        (the stream's last 15 ms)."""
        if self._upsample is None:
            import soxr

            self._upsample = soxr.ResampleStream(SPEECH_SAMPLE_RATE, STREAM_SAMPLE_RATE, 1, dtype="float32")
        return self._upsample.resample_chunk(x, last=last)

    def pcm(self, a: int, b: int) -> np.ndarray:
        """The stream's audio of stream samples [a, b) (16 kHz positions) at 48 kHz, int16 [(b - a) * 3] (silence
        where the stream has none: past its end, or long forgotten)."""
        a, b = a * BAND_PER_SAMPLE, b * BAND_PER_SAMPLE
        out = np.zeros(max(0, b - a), np.int16)
        with self._lock:
            size = len(self._band)
            lo, hi = max(a, self._band_length - size, 0), min(b, self._band_length)
            if hi > lo:
                part = self._band[np.arange(lo, hi) % size]
                out[lo - a:hi - a] = np.clip(np.round(part * 32768.0), -32768, 32767).astype(np.int16)
        return out

    def samples(self, a: int, b: int) -> np.ndarray:
        """The stream's 16 kHz audio of stream samples [a, b) decided so far, float32 (what the model hears)."""
        out = np.zeros(max(0, b - a), np.float32)
        with self._lock:
            size = len(self._ring)
            lo, hi = max(a, self.length - size, 0), min(b, self.length)
            if hi > lo:
                out[lo - a:hi - a] = self._ring[np.arange(lo, hi) % size]
        return out

    def source_index(self, pos: int) -> int:
        """How far into the source the stream is at stream position `pos`: the source index after the last of its
        samples before `pos` (0 if none came yet)."""
        with self._lock:
            for at, first, n in reversed(self.takes):
                if at < pos:
                    return first + min(n, pos - at)
        return 0

    def silence(self, start: int) -> None:
        """Silence what the stream holds from stream position `start` on (speech taken, not yet sent: an
        interruption). A decision in flight finishes first: speech it took from the source before the source was
        cleared is in the rings by then, and silenced with the rest."""
        with self._deciding, self._lock:
            for ring, length, at in ((self._ring, self.length, start),
                                     (self._band, self._band_length, start * BAND_PER_SAMPLE)):
                lo = max(at, length - len(ring), 0)
                if length > lo:
                    ring[np.arange(lo, length) % len(ring)] = 0.0

    @property
    def speech(self) -> int:
        """Samples of the stream that the source gave (the rest is silence)."""
        return self.source.taken

    def arrived_in(self, a: int, b: int) -> list[float]:
        """Arrival times of the source blocks that start in stream samples [a, b), forgetting every block before b
        (the output asks slot after slot, in order: each block is looked at once)."""
        out = []
        while self.arrivals and self.arrivals[0][0] < b:
            pos, t = self.arrivals.popleft()
            if pos >= a:
                out.append(t)
        return out


def _write_ring(ring: np.ndarray, at: int, x: np.ndarray) -> None:
    """`x` into `ring` from position `at` on (position p at p % len; only the last len(ring) samples stay)."""
    size = len(ring)
    tail = x[-size:]
    start = (at + len(x) - len(tail)) % size
    first = min(len(tail), size - start)
    ring[start:start + first] = tail[:first]
    ring[:len(tail) - first] = tail[first:]
