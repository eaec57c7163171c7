"""The live stream's audio on the wall clock: speech sent at the pace it is spoken, some pieces late, leaves no holes
of silence in the stream once a run of speech has its cushion, and the cushion grows when pieces come later still."""

from __future__ import annotations

import numpy as np

from ditto_fast.live.stream_audio import HOLD_MAX_S, IN_JITTER, StreamAudio

RATE = 16000
PIECE = 320                     # 20 ms


class _Arrivals:
    def __init__(self, source: "_Paced"):
        self.source = source

    def arrival_time(self, index: int) -> float | None:
        for start, t in self.source.pieces:
            if start <= index < start + PIECE and t <= self.source.now:
                return t
        return None


class _Paced:
    """Pieces of speech that arrive at given times (a client on a busy network); `now` is the test's clock."""

    def __init__(self, times: list[float]):
        self.pieces = [(i * PIECE, t) for i, t in enumerate(times)]
        self.arrivals, self.now, self.taken, self.ended = _Arrivals(self), 0.0, 0, False

    def _arrived(self) -> int:
        return sum(PIECE for _, t in self.pieces if t <= self.now)

    def available(self) -> int:
        return self._arrived() - self.taken

    def take(self, n: int) -> np.ndarray:
        got = max(0, min(n, self.available()))
        self.taken += got
        return np.full(got, 0.5, np.float32)

    def take_band(self, n: int):
        return None


def _stream(times: list[float], until: float) -> tuple[np.ndarray, StreamAudio]:
    source = _Paced(times)
    audio = StreamAudio(source, 0.0)
    out = []
    for k in range(int(until / 0.01)):          # the motion loop looks every 10 ms
        source.now = k * 0.01
        out.append(audio.advance(source.now))
    return np.concatenate(out), audio


def _holes(x: np.ndarray) -> list[int]:
    """The runs of silence between the first and the last speech, in samples."""
    loud = np.flatnonzero(x > 0)
    quiet = (x[loud[0]:loud[-1] + 1] == 0).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet, [0]])))
    return list(edges[1::2] - edges[::2])


def test_pieces_a_little_late_leave_no_holes():
    times = [1.0 + 0.02 * i for i in range(100)]
    for i in (10, 37, 61):
        times[i] += 0.06                        # late, each by three of its own length
    x, audio = _stream(times, 4.0)
    assert _holes(x) == [] and (x > 0).sum() == 100 * PIECE
    assert audio.hold == IN_JITTER and audio.late == 0


def test_a_late_piece_raises_the_cushion_so_the_next_leaves_no_hole():
    times = [1.0 + 0.02 * i for i in range(200)]
    times[20] += 0.3                            # a hiccup: one hole, then a longer cushion
    times[150] += 0.3                           # the same again: absorbed
    for i in range(21, 200):
        times[i] = max(times[i], times[20])     # (pieces arrive in order)
    x, audio = _stream(times, 6.0)
    assert len(_holes(x)) == 1 and IN_JITTER < audio.hold <= HOLD_MAX_S and audio.late == 1
    assert (x > 0).sum() == 200 * PIECE


def test_a_whole_answer_at_once_starts_at_once():
    x, audio = _stream([1.0] * 50, 3.0)
    first = np.flatnonzero(x > 0)[0] / RATE
    assert first < 1.0 + 0.02 and _holes(x) == []


class _Endless:
    """Speech that is always there, one sample at a time (the motion thread deciding as it goes)."""

    def __init__(self):
        self.arrivals, self.taken, self.ended = _Arrivals(_Paced([])), 0, False

    def available(self) -> int:
        return 1

    def take(self, n: int) -> np.ndarray:
        self.taken += min(n, 1)
        return np.full(min(n, 1), 0.5, np.float32)

    def take_band(self, n: int):
        return None


def test_where_the_stream_is_in_its_source_can_be_asked_while_it_is_decided():
    """The session's report thread asks `source_index` while the motion thread and the output decide (a serve
    session's events stopped: `deque mutated during iteration` killed the thread)."""
    import threading
    import time

    audio = StreamAudio(_Endless(), 0.0, jitter=0.0)
    for k in range(4096):                       # a full record of takes: a long walk for each question
        audio.advance(k / RATE)
    stop, errors = threading.Event(), []

    def ask():
        try:
            while not stop.is_set():
                audio.source_index(1)           # the oldest take: the whole record is walked
        except RuntimeError as e:
            errors.append(e)

    asker = threading.Thread(target=ask)
    asker.start()
    k, end = 4096, time.monotonic() + 2.0      # (the asker may hold the lock most of the time: two seconds of it)
    try:
        while not errors and time.monotonic() < end:
            audio.advance(k / RATE)
            k += 1
    finally:
        stop.set()
        asker.join()
    assert not errors, errors


def test_an_interruption_silences_the_speech_a_decision_in_flight_took():
    """The engine's reader interrupts (the source cleared, the stream silenced from what was sent) while the motion
    thread is between taking speech from the source and writing it into the stream: that speech is silenced too (it
    went out after the `cleared` frame that promised none)."""
    import threading

    class Interrupted(_Endless):
        interrupt = None

        def available(self) -> int:
            return 16000

        def take(self, n: int) -> np.ndarray:
            self.taken += n
            return np.full(n, 0.5, np.float32)

        def take_band(self, n: int):
            if self.interrupt is not None:          # taken, not yet written: the reader's interruption comes now
                interrupt, self.interrupt = self.interrupt, None
                reader = threading.Thread(target=interrupt)
                reader.start()
                reader.join(0.3)                    # (it waits for this decision to be written, or silences first)
                self.reader = reader
            return None

    source = Interrupted()
    audio = StreamAudio(source, 0.0, jitter=0.0)
    source.interrupt = lambda: audio.silence(0)
    audio.advance(0.5)
    source.reader.join(5)
    assert audio.length == 8000 and not np.any(audio.samples(0, 8000)) and not np.any(audio.pcm(0, 8000))
